/**
 * Schema building blocks shared by the core config and recipe stage schemas.
 *
 * Every leaf carries its expectation as its error text ("expected a positive number"), so the
 * issue formatter can append what it actually got and every message reads the same way.
 */
import { z } from 'zod';

/** A finite number > 0. */
export const positiveNumber = () => {
  const e = { error: 'expected a positive number' };
  return z.number(e).positive(e);
};

/** A finite number >= 0. */
export const nonNegativeNumber = () => {
  const e = { error: 'expected a number >= 0' };
  return z.number(e).min(0, e);
};

/** A number in [lo, hi) (for betas and clip ranges). */
export const numberIn = (lo: number, hi: number, hiInclusive = false) => {
  const e = { error: `expected a number in [${lo}, ${hi}${hiInclusive ? ']' : ')'}` };
  const base = z.number(e).min(lo, e);
  return hiInclusive ? base.max(hi, e) : base.lt(hi, e);
};

/** An integer >= 1. */
export const positiveInt = () => {
  const e = { error: 'expected a positive integer' };
  return z.int(e).min(1, e);
};

/** An integer >= 0. */
export const nonNegativeInt = () => {
  const e = { error: 'expected an integer >= 0' };
  return z.int(e).min(0, e);
};

/** A TCP port; 0 lets the OS pick one. */
export const port = () => {
  const e = { error: 'expected a port number (0-65535)' };
  return z.int(e).min(0, e).max(65535, e);
};

export const string = () => z.string({ error: 'expected a string' });

export const nonEmptyString = () => {
  const e = { error: 'expected a non-empty string' };
  return z.string(e).min(1, e);
};

export const boolean = () => z.boolean({ error: 'expected true or false' });

export const stringList = () => z.array(string(), { error: 'expected a list of strings' });

/** One of a fixed set of strings. */
export const oneOf = <const T extends readonly [string, ...string[]]>(values: T) =>
  z.enum(values, { error: `expected one of ${values.join(', ')}` });

/** A name of an environment variable. */
export const envName = () => {
  const e = { error: 'expected an environment variable name (letters, digits, _)' };
  return z.string(e).regex(/^[A-Za-z_][A-Za-z0-9_]*$/, e);
};

/**
 * A mapping section whose every key has a default: absent or `null` (YAML `section:` with nothing
 * after it) both mean "all defaults".
 */
export const section = <S extends z.core.$ZodLooseShape>(shape: S) =>
  z.preprocess((v) => (v === null || v === undefined ? {} : v), z.strictObject(shape, { error: 'expected a mapping' }));
