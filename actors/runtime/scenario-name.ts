/**
 * What a scenario may be called: the record store's key, a URL path segment and a metrics label
 * value, so lower-case and plain. The config checks names against it at start-up, so that no
 * default scenario or key's scenario list names one that every request would then be refused.
 */
export const SCENARIO_RE = /^[a-z0-9][a-z0-9._-]{0,63}$/;

export const SCENARIO_RULE = 'lower-case letters, digits, ".", "_" and "-", starting with a letter or digit, at most 64';
