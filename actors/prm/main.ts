import { EngineClient } from '../../cluster/engine-client.js';
import { stackEngines } from '../../cluster/stack-env.js';
import { runActor } from '../runtime/actor-host.js';
import { prmMessages } from './messages.js';

const engines = stackEngines()?.prm ?? [];
const clients = engines.map((url, i) => new EngineClient(url, { name: `prm-engine-${i}` }));

await runActor({
  name: 'prm',
  messages: prmMessages,
  createHandler: () => ({
    'prm-status': async () => ({ engines: await Promise.all(clients.map(async (c) => ({ url: c.baseUrl, healthy: await c.health() }))) }),
  }),
  onDrain: async () => {
    await Promise.all(clients.map((c) => c.close()));
  },
});
