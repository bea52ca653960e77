/** The serve.yaml loader: validate once, apply defaults, freeze. Reference: docs/config.md. */
export { configCheck, redact, type Output } from './check.js';
export { ConfigError, formatIssue, type ConfigIssue } from './errors.js';
export { layoutFromConfig, type Layout } from './layout.js';
export { overrideStrings, parseOverrides, type Overrides } from './overrides.js';
export { deepFreeze, loadConfig, resolveConfig, type ResolveOptions } from './resolve.js';
export { isLoopback } from './schema.js';
export type {
  ApiKeyConfig,
  ClusterSection,
  EngineConfig,
  EngineKind,
  LogLevel,
  PrmEngineConfig,
  RecipeClass,
  ReefConfig,
  ReefSection,
  StageClass,
  StageConfig,
  StageName,
  TrainingOptionSpec,
  TrainingOptionsSpec,
} from './types.js';
