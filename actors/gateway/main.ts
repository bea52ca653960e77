import { loadConfig } from '../../cluster/config/index.js';
import { stackEngines } from '../../cluster/stack-env.js';
import { ReefError } from '../runtime/errors.js';
import { runActor } from '../runtime/actor-host.js';
import { startGateway, type Gateway } from './index.js';
import { gatewayMessages } from './messages.js';

let gateway: Gateway | null = null;

await runActor({
  name: 'gateway',
  messages: gatewayMessages,
  async createHandler(ctx) {
    if (!ctx.configPath) throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: 'the gateway needs a config file' });
    const config = await loadConfig(ctx.configPath, ctx.overrides);
    const engines = stackEngines();
    if (!engines) throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: 'REEF_ENGINES is not set: start the gateway with `reef up`' });
    gateway = await startGateway({ config, engineUrl: engines.rollout, log: ctx.log });
    return gateway.handlers;
  },
  onDrain: async () => {
    await gateway?.close();
  },
  stats: (): Record<string, number> => (gateway ? { inflight: gateway.gate.inflight, records: gateway.store.stats().records } : {}),
});
