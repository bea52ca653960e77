import { loadConfig } from '../../cluster/config/index.js';
import { runActor } from '../runtime/actor-host.js';
import { ReefError } from '../runtime/errors.js';
import { startJudge, type Judge } from './index.js';
import { judgeMessages } from './messages.js';

let judge: Judge | null = null;

await runActor({
  name: 'judge',
  messages: judgeMessages,
  async createHandler(ctx) {
    if (!ctx.configPath) throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: 'the judge needs a config file' });
    const config = await loadConfig(ctx.configPath, ctx.overrides);
    judge = await startJudge({ config, log: ctx.log });
    return judge.handlers;
  },
  onDrain: async () => {
    await judge?.close();
  },
  stats: () => judge?.stats() ?? {},
});
