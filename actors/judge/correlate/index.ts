export { Correlator, nextStateOf } from './correlator.js';
export { canonicalJson, contentText, HashMemo, messageHash } from './hash.js';
export type { CorrelatorHead, CorrelatorState, SavedSession } from './state.js';
export {
  type CorrelationCounters,
  type CorrelationEvent,
  type CorrelationRecord,
  type CorrelatorConfig,
  type CorrelatorOptions,
  DEFAULT_CORRELATOR_CONFIG,
  type NextState,
  type SessionKey,
  type TurnFinished,
  type WarningCode,
} from './types.js';
