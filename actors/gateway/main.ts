import { loadConfig } from '../../cluster/config/index.js';
import { stackEngines } from '../../cluster/stack-env.js';
import { ReefError } from '../runtime/errors.js';
import { runActor } from '../runtime/actor-host.js';
import { lookupMailbox } from '../../cluster/lookup.js';
import { startGateway, type Gateway } from './index.js';
import { gatewayMessages } from './messages.js';
import { callRollback } from './rollback-rpc.js';
import { callForget } from './forget-rpc.js';
import { HANDOFF_DIR_ENV } from '../../cluster/held-listener.js';
import { statusReply } from '../../cluster/supervisor-messages.js';
import { RpcClient } from '../runtime/rpc.js';
import { stackStatus } from './stack-status.js';

let gateway: Gateway | null = null;
let supervisorClient: RpcClient | null = null;


await runActor({
  name: 'gateway',
  messages: gatewayMessages,
  async createHandler(ctx) {
    if (!ctx.configPath) throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: 'the gateway needs a config file' });
    const config = await loadConfig(ctx.configPath, ctx.overrides);
    const engines = stackEngines();
    if (!engines) throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: 'REEF_ENGINES is not set: start the gateway with `reef up`' });
    const supervisor = ctx.env.supervisor;
    // The supervisor's own status (actors, engines, placement) under /reef/status, for the live page.
    // Its answer waits for the shim's (up to 5 s), hence the longer timeout.
    const sup = supervisor ? (supervisorClient = new RpcClient(supervisor, { name: 'gateway→supervisor status', defaultTimeoutMs: 8_000, log: ctx.log })) : null;
    const stack = sup ? stackStatus(() => sup.call({ type: 'status' }, { schema: statusReply })) : null;
    gateway = await startGateway({
      config,
      engineUrl: engines.rollout,
      log: ctx.log,
      // Under `reef up` the supervisor holds reef.port and hands each connection over.
      handoff: process.env[HANDOFF_DIR_ENV] ? { socketDir: process.env[HANDOFF_DIR_ENV] } : null,
      reloadConfig: () => loadConfig(ctx.configPath!, ctx.overrides),
      ...(stack ? { status: async () => ({ ...(await stack()) }) } : {}),
      ...(supervisor ? { forget: (ids: string[]) => callForget((actor) => lookupMailbox(supervisor, actor, { running: true }), ids) } : {}),
      ...(supervisor
        ? {
            rollback: async (scenario: string, releaseId: string | null, keyId: string) => {
              const mailbox = await lookupMailbox(supervisor, 'trainer-controller');
              if (!mailbox) throw new ReefError('REEF_ERR_ACTOR_CLOSED', { actor: 'trainer-controller', state: 'not running' });
              return callRollback(mailbox, scenario, releaseId, keyId);
            },
          }
        : {}),
    });
    return gateway.handlers;
  },
  onDrain: async () => {
    await gateway?.close();
    await supervisorClient?.close();
  },
  stats: (): Record<string, number> => (gateway ? { inflight: gateway.gate.inflight, records: gateway.store.stats().records } : {}),
});
