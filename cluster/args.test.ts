import { describe, expect, it } from 'vitest';
import { parseArgs } from './args.js';

describe('parseArgs', () => {
  it.each([
    [['up', '-c', 'serve.yaml'], { positionals: ['up'], flags: { config: 'serve.yaml' }, overrides: [] }],
    [['up', '--config=s.yaml', '--detach'], { positionals: ['up'], flags: { config: 's.yaml', detach: true }, overrides: [] }],
    [['status', '--json'], { positionals: ['status'], flags: { json: true }, overrides: [] }],
    [['scale', 'prm', '3'], { positionals: ['scale', 'prm', '3'], flags: {}, overrides: [] }],
    [['config', 'check', 'f.yaml', '--reef.port=9000', '--pipeline.task2batch.config.batch_size=4'],
      { positionals: ['config', 'check', 'f.yaml'], flags: {}, overrides: ['--reef.port=9000', '--pipeline.task2batch.config.batch_size=4'] }],
  ] as const)('%j', (argv, want) => {
    const got = parseArgs(argv);
    expect({ positionals: got.positionals, flags: Object.fromEntries(got.flags), overrides: got.overrides }).toEqual(want);
  });

  it('rejects a dotted override without a value', () => {
    expect(() => parseArgs(['up', '--reef.port'])).toThrow(/needs a value/);
  });

  it('rejects a valued flag without its value', () => {
    expect(() => parseArgs(['up', '-c'])).toThrow(/--config needs a value/);
  });
});
