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

  // `reef down --data-dir "$DIR"` with DIR unset stopped the stack of the default data dir.
  it.each([[['down', '--data-dir', '']], [['down', '--data-dir=']], [['up', '-c=']], [['export', 'records', '--scenario=']]])('rejects an empty value in %j', (argv) => {
    expect(() => parseArgs(argv)).toThrow(/needs a value/);
  });

  // `reef up --detach=yes` ran in the foreground: a value other than true was read as false.
  it('takes true or false as the value of a switch, and refuses any other', () => {
    expect(Object.fromEntries(parseArgs(['status', '--json=true']).flags)).toEqual({ json: true });
    expect(Object.fromEntries(parseArgs(['status', '--json=false']).flags)).toEqual({});
    expect(() => parseArgs(['up', '--detach=yes'])).toThrow('--detach takes no value (or =true, =false), not "yes"');
    expect(() => parseArgs(['status', '--json=1'])).toThrow(/--json takes no value/);
  });

  it('keeps everything after the first = in a flag value, and takes -- as the end of flags', () => {
    const got = parseArgs(['export', '--out=a=b.jsonl', '--config=x.yaml', '--', '--json', '--reef.port=1']);
    expect(Object.fromEntries(got.flags)).toEqual({ out: 'a=b.jsonl', config: 'x.yaml' });
    expect(got.positionals).toEqual(['export', '--json', '--reef.port=1']);
    expect(got.overrides).toEqual([]);
  });

  // `reef status --jsno` printed the text status and exit 0, `reef down --data-dr D` stopped the
  // stack of the default data dir: a mistyped flag was stored and never read.
  it('rejects an unknown flag, naming it as written', () => {
    expect(() => parseArgs(['status', '--jsno'])).toThrow('unknown flag --jsno (did you mean --json?)');
    expect(() => parseArgs(['down', '--data-dr=/x'])).toThrow('unknown flag --data-dr (did you mean --data-dir?)');
    expect(() => parseArgs(['status', '-x'])).toThrow(/^unknown flag -x$/);
    expect(() => parseArgs(['up', '--timeout', '5'])).toThrow(/unknown flag --timeout/);
  });
});
