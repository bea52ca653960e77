import type { ReefConfig } from '../../cluster/config/types.js';
import { stackEngines } from '../../cluster/stack-env.js';
import type { LogFn } from '../runtime/log.js';
import type { Handlers } from '../runtime/mailbox.js';
import type { PrmMessage } from './messages.js';
import { PrmClient } from './prm-client.js';
import { prmSettings } from './settings.js';
import { JudgeLink, PrmWorker } from './worker.js';

/** A PRM actor, wired: settings from the config, the PRM client, the pulling worker. */
export interface PrmActor {
  handlers: Handlers<PrmMessage>;
  stats(): Record<string, number>;
  /** Finish or give back the turns held, then close the PRM client. */
  close(): Promise<void>;
}

export interface StartPrmOptions {
  actorId: string;
  config: ReefConfig;
  /** The supervisor's control endpoint (to look up the judge); null with `judgeMailbox`. */
  supervisor: string | null;
  /** A fixed judge endpoint. @default REEF_JUDGE_MAILBOX, else found through the supervisor */
  judgeMailbox?: string | null;
  log: LogFn;
}

export function startPrmActor(opts: StartPrmOptions): PrmActor {
  const s = prmSettings(opts.config, stackEngines());
  if (s.mode === 'correlate-only' || s.urls.length === 0) {
    opts.log(s.mode === 'correlate-only' ? 'correlate-only mode (no PRM configured): idle' : 'no PRM engine URL in REEF_ENGINES: idle');
    return {
      handlers: { 'prm-status': () => ({ mode: s.mode, urls: s.urls, stats: {}, held: [] }) },
      stats: () => ({}),
      close: async () => {},
    };
  }
  const prm = new PrmClient(s);
  const link = new JudgeLink(opts.supervisor, opts.judgeMailbox ?? process.env.REEF_JUDGE_MAILBOX ?? null, opts.log);
  const worker = new PrmWorker({ actorId: opts.actorId, link, prm, m: s.m, concurrency: s.concurrency, log: opts.log });
  worker.start();
  opts.log(`pulling turns from the judge: ${s.api} PRM at ${s.urls.join(', ')}, ${s.m}+${s.m} votes per turn, ${s.concurrency} calls at once, ${worker.credits} credits`);
  return {
    handlers: { 'prm-status': () => ({ mode: s.mode, urls: s.urls, stats: worker.stats(), held: worker.held() }) },
    stats: () => worker.stats(),
    async close() {
      // A drain must not wait out a thinking model's hour-long vote: after a short grace the
      // turns go back to the judge for another actor.
      await worker.drain(Math.min(s.timeoutMs, 5000));
      await prm.close();
    },
  };
}
