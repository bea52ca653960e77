import { join } from 'node:path';
import { loadConfig } from '../../cluster/config/index.js';
import { SqliteStore } from '../gateway/store/sqlite-store.js';
import { runActor } from '../runtime/actor-host.js';
import { ReefError } from '../runtime/errors.js';
import { judgeMessages } from './messages.js';

const CONSUMER = 'judge';
let store: SqliteStore | null = null;

await runActor({
  name: 'judge',
  messages: judgeMessages,
  async createHandler(ctx) {
    if (!ctx.configPath) throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: 'the judge needs a config file' });
    const config = await loadConfig(ctx.configPath, ctx.overrides);
    store = SqliteStore.open(join(config.reef.data_dir, 'records.sqlite'));
    const s = store;
    return {
      'judge-status': async () => ({ consumer: CONSUMER, nextOffset: await s.getOffset(CONSUMER), headOffset: await s.headOffset() }),
    };
  },
  onDrain: async () => {
    await store?.close();
  },
});
