import { EngineClient } from '../../cluster/engine-client.js';
import { stackEngines } from '../../cluster/stack-env.js';
import { runActor } from '../runtime/actor-host.js';
import { trainerControllerMessages } from './messages.js';

const url = stackEngines()?.rollout ?? null;
const rollout = url ? new EngineClient(url, { name: 'rollout' }) : null;

await runActor({
  name: 'trainer-controller',
  messages: trainerControllerMessages,
  createHandler: () => ({
    'trainer-status': async () => ({ rollout: url, weightVersion: rollout ? ((await rollout.modelInfo().catch(() => null))?.weight_version ?? null) : null }),
  }),
  onDrain: async () => {
    await rollout?.close();
  },
});
