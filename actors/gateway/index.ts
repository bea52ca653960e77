import { existsSync, mkdirSync } from 'node:fs';
import { basename, join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { EngineClient } from '../../cluster/engine-client.js';
import type { ReefConfig } from '../../cluster/config/index.js';
import { PRINTABLE_ASCII, shortKeyProblem } from '../../cluster/config/schema.js';
import { ReefError } from '../runtime/errors.js';
import type { Handlers } from '../runtime/mailbox.js';
import { Authenticator, keyIdOf, type ApiKeySpec } from './auth.js';
import type { BrowserGuardOptions } from './browser-guard.js';
import type { ChatDeps } from './chat.js';
import { GenerationGate } from './generation-gate.js';
import type { GatewayMessage } from './messages.js';
import { GatewayMetrics } from './metrics.js';
import { parserFor } from './parsers/index.js';
import type { PromptTokenizer } from './ports.js';
import { registerReefRoutes } from './routes/reef.js';
import { buildGatewayServer } from './server.js';
import { type HandedConnections, serveHandedConnections } from './handoff.js';
import { gatewayUrl } from '../../cluster/net.js';
import { DiskGuard, limitsFromConfig, ScenarioCap } from './limits.js';
import { scheduleRetention } from './store/retention.js';
import { SqliteStore } from './store/sqlite-store.js';
import { newId } from './store/ids.js';
import { ChatTokenizer, defaultTokenizerThreads, prepareChat, TokenizerPool } from './tokenize/index.js';
import { PipelineStatus } from './pipeline-status.js';
import type { Release } from '../trainer-controller/controller.js';
import { readReleases } from '../trainer-controller/releases.js';
import { type Forgotten, resumeDeletionsLater } from './forget-rpc.js';

/**
 * The gateway, wired: store + tokenizer pool + engine client + HTTP server + generation gate.
 * Used by the actor process (main.ts) and, in-process, by integration tests and benchmarks.
 */

export interface GatewayOptions {
  config: ReefConfig;
  /** The rollout engine's URL. */
  engineUrl: string;
  /** Listen here instead of `reef.host:reef.port` (tests use port 0). */
  listen?: { host: string; port: number };
  /**
   * Serve the connections the supervisor accepts on `reef.host:reef.port` and hands over the IPC
   * channel (handoff.ts) instead of listening there; `socketDir` is the supervisor's private
   * directory (`REEF_HANDOFF_DIR`). @default null: listen (a gateway run on its own, tests)
   */
  handoff?: { socketDir: string } | null;
  /** Tokenizer worker threads. @default defaultTokenizerThreads() (cores − 1, 1 to 4) */
  tokenizerThreads?: number;
  /** Bodies up to this many bytes are prepared on the event loop (0: every request goes to a worker). @default INLINE_PREPARE_BYTES */
  inlinePrepareBytes?: number;
  /** Extra fields for `/reef/status` (correlation, training). */
  status?: () => Record<string, unknown> | Promise<Record<string, unknown>>;
  /**
   * The config as it reads now, from the file and overrides it was loaded from, for `reload-keys`;
   * absent: a reload is refused (a gateway started from a config object has nothing to re-read).
   */
  reloadConfig?: () => Promise<ReefConfig>;
  /** Puts an earlier release back (asks the trainer-controller); absent when no training runs. */
  rollback?: (scenario: string, releaseId: string | null, keyId: string) => Promise<unknown>;
  /**
   * Deletion on request: has the judge and the trainer-controller drop what they hold of these
   * records (forget-rpc.ts). @default null: none runs beside this gateway (tests, a gateway alone)
   */
  forget?: ((recordIds: string[]) => Promise<Forgotten>) | null;
  log?: (line: string) => void;
}

export interface Gateway {
  app: FastifyInstance;
  url: string;
  store: SqliteStore;
  gate: GenerationGate;
  metrics: GatewayMetrics;
  handlers: Handlers<GatewayMessage>;
  close(): Promise<void>;
}

/** Releases that trained on the scenario's batches, plus rollbacks (they affect every scenario), newest first. */
export function releasesOf(releases: readonly Release[], scenario: string): Release[] {
  return releases.filter((r) => r.rollbackOf !== null || r.batchIds.some((b) => b.startsWith(`${scenario}:`))).reverse();
}

export function resolveApiKeys(cfg: ReefConfig, env: NodeJS.ProcessEnv = process.env): ApiKeySpec[] {
  return cfg.reef.api_keys.map((k, i) => {
    // Trimmed like a client's key (auth.ts extractKey): a value written with a trailing newline
    // must still match.
    const key = k.key ?? (k.key_env ? env[k.key_env]?.trim() : undefined);
    if (!key) throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: `reef.api_keys[${i}].key_env: environment variable ${k.key_env} is not set or is blank` });
    if (!PRINTABLE_ASCII.test(key)) throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: `reef.api_keys[${i}].key_env: environment variable ${k.key_env} holds characters other than printable ASCII, which no client can send in a header` });
    const short = shortKeyProblem(key.length);
    if (short !== null) throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: `reef.api_keys[${i}].key_env: the key in environment variable ${k.key_env} ${short}` });
    return { key, scenarios: k.scenarios, maxConcurrency: k.max_concurrency, requestsPerMinute: k.requests_per_minute, tokensPerMinute: k.tokens_per_minute };
  });
}

/** The names and origins a keyless gateway answers browsers from. */
export function browserOptions(cfg: ReefConfig): BrowserGuardOptions {
  return { bindHost: cfg.reef.host, allowedHosts: cfg.reef.allowed_hosts, allowedOrigins: cfg.reef.allowed_origins };
}

/**
 * Request bodies up to this size are prepared on the event loop. A round trip to a tokenizer worker
 * costs ~0.15–0.3 ms of CPU (message ports, wake-ups, clones), five times the ~60 µs it takes to
 * parse, validate, render and tokenize a short chat, so sending short requests to a worker would
 * only halve throughput. Long transcripts, where the work is milliseconds, always go to a worker.
 */
export const INLINE_PREPARE_BYTES = 4096;

/** Starts tokenization in a pool bound to one model directory, plus the event loop's own tokenizer for short requests. */
async function promptTokenizer(modelDir: string, threads: number, inlineBytes: number): Promise<{ tok: PromptTokenizer; pool: TokenizerPool }> {
  const pool = await TokenizerPool.create(modelDir, { threads });
  // Small: only short requests come here, so its piece cache stays small too.
  const inline = inlineBytes > 0 ? ChatTokenizer.load(modelDir, { cacheMaxIds: 100_000 }) : null;
  const tok: PromptTokenizer = {
    contextLength: pool.contextLength ?? 32_768,
    prepare: async (body, params) => {
      // Short prompts gain nothing from reusing their last id text: the inline path keeps none.
      if (inline !== null && body.byteLength <= inlineBytes) return prepareChat(inline, body, { ...params, sessionKey: null });
      return pool.prepare(body, params);
    },
  };
  return { tok, pool };
}

export async function startGateway(opts: GatewayOptions): Promise<Gateway> {
  const cfg = opts.config;
  const modelDir = cfg.cluster.rollout.model_path;
  if (!existsSync(join(modelDir, 'tokenizer.json'))) {
    throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: `cluster.rollout.model_path: ${modelDir} has no tokenizer.json (the gateway tokenizes with the model's own tokenizer)` });
  }
  // Before anything is opened or started: a key_env that is unset or holds a bad key ends it here.
  const keys = resolveApiKeys(cfg);
  // A first start, or a gateway run on its own: reef.data_dir need not exist yet.
  mkdirSync(cfg.reef.data_dir, { recursive: true });
  const metrics = new GatewayMetrics();
  // Records come only from chat completions: with no other request in flight, none can join a commit.
  // The judge and the trainer-controller commit to the same file: the gateway waits for their write
  // lock on a timer, never in SQLite's busy handler, which would stop every stream it serves.
  const store = SqliteStore.open(join(cfg.reef.data_dir, 'records.sqlite'), {
    durability: cfg.reef.durability,
    company: () => metrics.inflightCount > 1,
    pageBytes: cfg.reef.limits.page_bytes,
    lockWait: 'async',
    busyTimeoutMs: cfg.reef.limits.store_lock_wait_ms,
    lockWaitSetting: 'reef.limits.store_lock_wait_ms',
  });
  const engine = new EngineClient(opts.engineUrl, { name: 'rollout', requestTimeoutMs: cfg.reef.limits.engine_timeout_s * 1000, timeoutSetting: 'reef.limits.engine_timeout_s' });
  let pool: TokenizerPool | null = null;
  let stopPipeline = () => {};
  try {
    const t = await promptTokenizer(modelDir, opts.tokenizerThreads ?? defaultTokenizerThreads(), opts.inlinePrepareBytes ?? INLINE_PREPARE_BYTES);
    pool = t.pool;
    const info = await engine.modelInfo().catch(() => null);
    const gate = new GenerationGate(info?.weight_version ?? null, undefined, (ms) =>
      opts.log?.(`generation was paused for ${ms} ms without a resume (did the trainer-controller stop mid-swap?); admitting requests again`),
    );
    const topK = Number((cfg.training.resolved as { topK?: number }).topK ?? 4);
    const chat: ChatDeps = {
      tokenizer: t.tok,
      parser: parserFor(modelDir),
      engine,
      engineName: `${cfg.cluster.rollout.engine}:${opts.engineUrl}`,
      records: { newId, append: (r) => store.append(r), stage: (p) => store.stage(p) },
      gate,
      metrics,
      modelName: basename(modelDir),
      topK,
      // null in config: the rest of the context (prepare caps every request by the room left).
      defaultMaxTokens: cfg.reef.default_max_tokens ?? Number.POSITIVE_INFINITY,
    };
    const pipeline = new PipelineStatus(store);
    await pipeline.start();
    metrics.addSection(() => pipeline.render());
    const { max_age_days: maxAgeDays, max_size_mb: maxSizeMb } = cfg.reef.retention;
    const policy = { maxAgeMs: maxAgeDays === null ? null : maxAgeDays * 86_400_000, maxBytes: maxSizeMb === null ? null : Math.floor(maxSizeMb * 1048576) };
    const stopRetention = maxAgeDays === null && maxSizeMb === null ? () => {} : scheduleRetention(store, policy, cfg.reef.retention.interval_s * 1000, (l) => opts.log?.(l));
    const forget = opts.forget ?? null;
    const stopResume = resumeDeletionsLater(store, forget, (l) => opts.log?.(l));
    stopPipeline = () => {
      pipeline.stop();
      stopRetention();
      stopResume();
    };
    const limits = limitsFromConfig(cfg);
    const auth = new Authenticator(keys, limits.principals);
    const disk = new DiskGuard(cfg.reef.data_dir, limits.minFreeDiskBytes);
    const scenarios = new ScenarioCap((await store.listScenarios()).map((s) => s.name), cfg.reef.limits.max_scenarios);
    const app = buildGatewayServer({
      limits,
      disk,
      scenarios,
      chat,
      auth,
      responses: store,
      defaultScenario: cfg.reef.default_scenario,
      browser: browserOptions(cfg),
      registerReefRoutes: (a, principalOf) =>
        registerReefRoutes(a, {
          store,
          defaultScenario: cfg.reef.default_scenario,
          scenarios,
          disk,
          status: async () => ({ gateway: { weightVersion: gate.weightVersion, paused: gate.isPaused, inflight: gate.inflight }, ...(await pipeline.refresh()), ...(await opts.status?.()) }),
          releases: async (scenario) => releasesOf(await readReleases(store), scenario),
          deletion: {
            deleteRecords: async (target) => {
              let forgotten: Forgotten | null = null;
              const counts = await store.deleteRecords(target, async (ids) => {
                forgotten = forget ? await forget(ids) : null;
              });
              opts.log?.(`deletion on request: ${counts.records} record(s) of ${target.session === null ? `scenario ${target.scenario}` : `a session of scenario ${target.scenario}`} and what quotes them`);
              return { ...counts, forgotten };
            },
            recordIdsOf: (target) => store.recordIdsOf(target),
            batchesOf: (ids) => store.batchesOf(ids),
            releases: () => readReleases(store),
          },
          ...(opts.rollback
            ? {
                rollback: (scenario: string, body: unknown, keyId: string) => {
                  const id = body && typeof body === 'object' && 'release_id' in body ? (body as { release_id: unknown }).release_id : null;
                  if (id !== null && typeof id !== 'string') throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: 'release_id must be a string or null' });
                  // It changes the weights every scenario is served: the log says which key asked.
                  opts.log?.(`rollback to ${id === null ? 'the previous release' : id} asked by key ${keyId} (scenario ${scenario})`);
                  return opts.rollback!(scenario, id, keyId);
                },
              }
            : {}),
        }, principalOf),
    });
    let handed: HandedConnections | null = null;
    let address: string;
    if (opts.handoff) {
      handed = await serveHandedConnections(app, { socketDir: opts.handoff.socketDir, maxConnections: limits.maxConnections, log: opts.log });
      // The address clients use: the supervisor's socket, which the stack bound on reef.port.
      address = gatewayUrl({ host: cfg.reef.host, port: cfg.reef.port });
    } else {
      address = await app.listen(opts.listen ?? { host: cfg.reef.host, port: cfg.reef.port });
      opts.log?.(`gateway listening on ${address}`);
    }
    const handlers: Handlers<GatewayMessage> = {
      'pause-generation': async (msg) => {
        const drain = await gate.pause(msg.drainTimeoutMs, msg.maxPauseMs);
        // The swap goes ahead with them running, which nothing else would tell an operator.
        if (!drain.drained) opts.log?.(`weight swap: ${drain.inflight} generation(s) still running after the ${msg.drainTimeoutMs} ms drain; the swap goes ahead with them`);
        return drain;
      },
      'resume-generation': async (msg) => {
        // The version is stamped on every record whose engine reply names none, and the trainer
        // drops records outside its lineage: a forged one would starve training. The controller
        // resumes with a version only after loading it into the rollout engine, and lists the
        // release only after the resume, so the engine, not the store, is what can vouch for it.
        if (msg.weightVersion !== null) {
          const served = (await engine.modelInfo()).weight_version ?? null;
          if (served !== msg.weightVersion) {
            throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `resume-generation: weight version ${JSON.stringify(msg.weightVersion)} is not the one the rollout engine serves (${JSON.stringify(served)})` });
          }
        }
        gate.resume(msg.weightVersion);
        return { weightVersion: gate.weightVersion };
      },
      'gateway-status': () => ({ weightVersion: gate.weightVersion, paused: gate.isPaused, inflight: gate.inflight, url: address }),
      'reload-keys': async () => {
        if (!opts.reloadConfig) throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: 'reload-keys: this gateway was started from a config object, not a file, so there is nothing to re-read' });
        // Both steps validate everything (the config's rules, key_env values, duplicates) before
        // the swap: a bad key leaves the old ones in force.
        const specs = resolveApiKeys(await opts.reloadConfig());
        auth.replace(specs);
        opts.log?.(`API keys reloaded: ${specs.length} in force (ids ${specs.map((s) => keyIdOf(s.key)).join(', ') || 'none'})`);
        return { keys: auth.size };
      },
    };
    let closing: Promise<void> | null = null;
    return {
      app,
      url: address,
      store,
      gate,
      metrics,
      handlers,
      close: () =>
        (closing ??= (async () => {
          // Stop taking requests, let the ones in flight finish and commit, then close the store.
          stopPipeline();
          gate.close();
          handed?.stop();
          await app.close();
          // The HTTP server's close waits only for the connections it accepted itself; the handed
          // ones finish their requests (each answered with connection: close) or were idle and closed.
          await handed?.drained();
          await pool?.close();
          await engine.close();
          await store.close();
        })()),
    };
  } catch (err) {
    stopPipeline();
    await pool?.close();
    await engine.close();
    await store.close();
    throw err;
  }
}
