import { ReefError } from '../../actors/runtime/errors.js';

/** One problem found in a config: the full dotted path (`reef.api_keys[0].key`) and what is wrong. */
export interface ConfigIssue {
  path: string;
  message: string;
}

/**
 * One line per issue. Most read `path: message`; a misplaced key reads as a sentence
 * (`recipe.config.prm_url belongs at pipeline.record2record.config.prm_url`).
 */
export function formatIssue(issue: ConfigIssue): string {
  if (issue.path === '') return issue.message;
  return issue.message.startsWith('belongs at ') ? `${issue.path} ${issue.message}` : `${issue.path}: ${issue.message}`;
}

/** Thrown by the loader with every issue found, not just the first. */
export class ConfigError extends ReefError {
  readonly issues: readonly ConfigIssue[];

  constructor(code: 'REEF_ERR_CONFIG_INVALID' | 'REEF_ERR_CONFIG_FILE', issues: ConfigIssue[], params: Record<string, unknown> = {}) {
    const details = issues.map((i) => `\n  ${formatIssue(i)}`).join('');
    super(code, { details, ...params });
    this.name = 'ConfigError';
    this.issues = Object.freeze(issues.map((i) => Object.freeze({ ...i })));
  }
}
