import { loadConfig } from '../../cluster/config/index.js';
import { runActor } from '../runtime/actor-host.js';
import { ReefError } from '../runtime/errors.js';
import { startPrmActor, type PrmActor } from './index.js';
import { prmMessages } from './messages.js';

let actor: PrmActor | null = null;

await runActor({
  name: 'prm',
  messages: prmMessages,
  async createHandler(ctx) {
    if (!ctx.configPath) throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: 'a PRM actor needs a config file' });
    const config = await loadConfig(ctx.configPath, ctx.overrides);
    actor = startPrmActor({ actorId: ctx.id, config, supervisor: ctx.env.supervisor, log: ctx.log });
    return actor.handlers;
  },
  onDrain: async () => {
    await actor?.close();
  },
  stats: () => actor?.stats() ?? {},
});
