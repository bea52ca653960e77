import { Template } from '@huggingface/jinja';
import { jinjaTitle, pyCapitalize, pyCharAt, pyCompare, pyFloatRepr, pyIsLower, pyIsUpper, pyLen, pySplitWhitespace, pyStrip, pyStrRepr, pyTitle } from './py-str.js';

/**
 * A chat template compiled into closures over plain JS values, with the exact semantics of the
 * @huggingface/jinja 0.5 interpreter as jinja-compat.ts patches it, which is Python jinja2's
 * wherever a difference was found (transformers renders the training prompts with jinja2;
 * test/parity/template-python.int.test.ts holds both renderers to it).
 *
 * The interpreter wraps every value in a class instance, builds a Map and a closure for every scope
 * and a Map of ~25 closures for each string method call; for a long agent prompt that churn is
 * most of a render. Here the AST is walked once: every node becomes a closure, variables live in
 * slot arrays laid out at compile time, and values stay plain (strings, numbers, booleans, null,
 * undefined, arrays, plain objects) plus a few classes for what has no plain form (namespace,
 * tuple, loop, macro).
 *
 * Two safety valves keep the output exact:
 * - compile time: a construct with no exact counterpart here refuses the whole template
 *   (`compileTemplate` answers with a reason) and the caller keeps the interpreter;
 * - run time: whatever would take semantics not reproduced here (`+` of a list and a string, a
 *   method on the wrong type, a float with an integral value, anything the interpreter would throw
 *   on, including `raise_exception`) throws `Unsupported`, and the caller renders that request
 *   with the interpreter, which then produces its own output or its own error.
 */

/** This request needs the interpreter; not an error of the template. */
export class Unsupported extends Error {
  constructor(readonly reason: string) {
    super(`compiled template: ${reason}`);
    this.name = 'Unsupported';
  }
}

function unsupported(reason: string): never {
  throw new Unsupported(reason);
}

class Refusal extends Error {}

function refuse(reason: string): never {
  throw new Refusal(reason);
}

// ---------------------------------------------------------------------------------------------
// AST shapes (the package exports its parser but not its node types)

interface N { type: string }
interface IdentN extends N { value: string }
interface LitN<T> extends N { value: T }
interface IfN extends N { test: N; body: N[]; alternate: N[] }
interface ForN extends N { loopvar: N; iterable: N; body: N[]; defaultBlock: N[] }
interface SetN extends N { assignee: N; value: N | null; body: N[] }
interface MacroN extends N { name: IdentN; args: N[]; body: N[] }
interface CallStmtN extends N { call: CallN; callerArgs: N[] | null; body: N[] }
interface FilterStmtN extends N { filter: N; body: N[] }
interface MemberN extends N { object: N; property: N; computed: boolean }
interface CallN extends N { callee: N; args: N[] }
interface BinaryN extends N { operator: { value: string }; left: N; right: N }
interface UnaryN extends N { operator: { value: string }; argument: N }
interface FilterN extends N { operand: N; filter: N }
interface TestN extends N { operand: N; negate: boolean; test: IdentN }
interface SelectN extends N { lhs: N; test: N }
interface TernaryN extends N { condition: N; trueExpr: N; falseExpr: N }
interface SliceN extends N { start?: N; stop?: N; step?: N }
interface KwargN extends N { key: IdentN; value: N }

// ---------------------------------------------------------------------------------------------
// Values with no plain form

abstract class Special {
  abstract truthy(): boolean;
  /** `x.name` (and `x['name']`) */
  abstract attr(name: string): unknown;
}

/** `namespace(...)`: the only value a template can mutate (`set ns.x = ...`). */
class Namespace extends Special {
  readonly vals = new Map<string, unknown>();
  truthy(): boolean {
    return true;
  }
  attr(name: string): unknown {
    return this.vals.get(name);
  }
}

/** `(a, b)`: the interpreter treats a tuple as a list in some places and refuses it in others. */
class Tuple extends Special {
  constructor(readonly items: readonly unknown[]) {
    super();
  }
  truthy(): boolean {
    return this.items.length > 0;
  }
  attr(name: string): unknown {
    return name === 'length' ? this.items.length : undefined;
  }
}

/** `loop` inside a for body, computed on access rather than built as a nine-entry map. */
class LoopInfo extends Special {
  constructor(readonly items: readonly unknown[], readonly i: number) {
    super();
  }
  truthy(): boolean {
    return true;
  }
  attr(name: string): unknown {
    const { items, i } = this;
    const n = items.length;
    switch (name) {
      case 'index': return i + 1;
      case 'index0': return i;
      case 'revindex': return n - i;
      case 'revindex0': return n - i - 1;
      case 'first': return i === 0;
      case 'last': return i === n - 1;
      case 'length': return n;
      case 'previtem': return i > 0 ? items[i - 1] : undefined;
      case 'nextitem': return i < n - 1 ? items[i + 1] : undefined;
    }
    // loop.cycle is rendered by the interpreter (jinja-compat.ts).
    if (OBJECT_METHODS.has(name) || name === 'cycle') unsupported(`loop.${name}`);
    return undefined;
  }
}

abstract class Callable extends Special {
  truthy(): boolean {
    return true;
  }
  attr(): unknown {
    return undefined;
  }
}

class MacroValue extends Callable {
  constructor(readonly def: FrameDef) {
    super();
  }
}

/** `caller` inside a macro invoked by `{% call %}`: the call block's body, bound to where it stood. */
class CallerValue extends Callable {
  constructor(readonly def: FrameDef, readonly scope: Scope) {
    super();
  }
}

type BuiltinName = 'namespace' | 'range' | 'raise_exception' | 'strftime_now';
class Builtin extends Callable {
  constructor(readonly name: BuiltinName) {
    super();
  }
}

const GLOBALS = new Map<string, unknown>([
  ['false', false], ['true', true], ['none', null], ['False', false], ['True', true], ['None', null],
  ['raise_exception', new Builtin('raise_exception')], ['range', new Builtin('range')],
  ['strftime_now', new Builtin('strftime_now')], ['namespace', new Builtin('namespace')],
]);
const GLOBAL_NAMES = [...GLOBALS.keys()];

const STRING_METHODS = new Set(['upper', 'lower', 'strip', 'title', 'capitalize', 'rstrip', 'lstrip', 'startswith', 'endswith', 'split', 'replace']);
const OBJECT_METHODS = new Set(['get', 'items', 'keys', 'values', 'dictsort']);

const hasOwn = Object.hasOwn as (o: object, key: string) => boolean;

type Plain = Record<string, unknown>;

function isPlain(v: unknown): v is Plain {
  return typeof v === 'object' && v !== null && !Array.isArray(v) && !(v instanceof Special);
}

/** Items of a list or tuple (the interpreter's ArrayValue), else null. */
function listItems(v: unknown): readonly unknown[] | null {
  if (Array.isArray(v)) return v;
  if (v instanceof Tuple) return v.items;
  return null;
}

function isInt(v: unknown): v is number {
  return typeof v === 'number' && Number.isInteger(v);
}

function truthy(v: unknown): boolean {
  switch (typeof v) {
    case 'string': return v.length > 0;
    case 'number': return v !== 0 && v === v;
    case 'boolean': return v;
    case 'undefined': return false;
    case 'object': {
      if (v === null) return false;
      if (Array.isArray(v)) return v.length > 0;
      if (v instanceof Special) return v.truthy();
      for (const k in v) if (hasOwn(v, k)) return true;
      return false;
    }
  }
  return unsupported(`truth value of a ${typeof v}`);
}

/**
 * Numbers: the interpreter makes an integer of every JS number for which Number.isInteger holds
 * and a float of the rest, and prints floats with a `.0` when integral. Plain numbers cannot carry
 * that distinction, so an operation whose result would be an integral float (or an integer that is
 * not one) is left to the interpreter; every number here is then an integer exactly when
 * Number.isInteger says so, and prints with String().
 */
function intResult(x: number): number {
  if (!Number.isInteger(x)) unsupported('integer arithmetic left the integers');
  return x;
}

function floatResult(x: number): number {
  if (Number.isInteger(x)) unsupported('a float with an integral value');
  return x;
}

/**
 * Python's `str()` of a scalar: how jinja2 prints it and how `~` and the `string` filter convert
 * it (jinja-compat.ts gives the interpreter the same). The interpreter wrote JS's `true`, `false`,
 * nothing for none and `1e-7`, where Qwen3-Coder's templates print tool-call arguments with
 * `args_value | string` and transformers writes `True`, `None` and `1e-07`.
 */
function pyScalar(v: string | number | boolean | null): string {
  switch (typeof v) {
    case 'string': return v;
    case 'number': return Number.isInteger(v) ? String(v) : pyFloatRepr(v);
    case 'boolean': return v ? 'True' : 'False';
  }
  return 'None';
}

/** What a `{{ }}` prints: undefined prints nothing, lists and mappings as Python's repr. */
function toStr(v: unknown): string {
  switch (typeof v) {
    case 'string': return v;
    case 'number':
    case 'boolean': return pyScalar(v);
    case 'undefined': return '';
    case 'object': return v === null ? 'None' : pyRepr(v);
  }
  return unsupported(`printing a ${typeof v}`);
}

/**
 * Python's `repr` of a list or mapping (`['a', True, None]`, `{'k': 1.5}`), as jinja2 prints them
 * and the `string` filter converts them; the interpreter wrote JSON (jinja-compat.ts now the same).
 */
function pyRepr(v: unknown): string {
  switch (typeof v) {
    case 'string': return pyStrRepr(v);
    case 'number':
    case 'boolean': return pyScalar(v);
    case 'undefined': return 'Undefined';
    case 'object': break;
    default: return unsupported(`repr of a ${typeof v}`);
  }
  if (v === null) return 'None';
  if (Array.isArray(v)) return '[' + v.map(pyRepr).join(', ') + ']';
  const entries = isPlain(v) ? Object.entries(v) : v instanceof Namespace ? Array.from(v.vals) : unsupported('repr of a tuple, loop or macro');
  const dict = '{' + entries.map(([k, x]) => pyStrRepr(k) + ': ' + pyRepr(x)).join(', ') + '}';
  return v instanceof Namespace ? `<Namespace ${dict}>` : dict;
}

// ---------------------------------------------------------------------------------------------
// JSON, as the interpreter's toJSON writes it

/** `pyFloats`: non-integral numbers as Python's json.dumps writes them (`tojson`, patched in jinja-compat.ts); printing keeps JS's. */
interface JsonOptions { indent: number | null; ascii: boolean; sortKeys: boolean; itemSep: string; keySep: string; pyFloats: boolean }

const JSON_DEFAULT: JsonOptions = { indent: null, ascii: false, sortKeys: false, itemSep: ', ', keySep: ': ', pyFloats: false };
const JSON_TOJSON: JsonOptions = { ...JSON_DEFAULT, pyFloats: true };

const NON_ASCII = /[\x7f-\uffff]/g;
/** JSON text with `ensure_ascii`, as the interpreter escapes it; jinja-compat.ts's `tojson` too. */
export function asciiOnly(s: string): string {
  return s.replace(NON_ASCII, (c) => '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0'));
}

function toJson(v: unknown, o: JsonOptions, depth: number, undefinedAsNull: boolean): string {
  switch (typeof v) {
    case 'string': return o.ascii ? asciiOnly(JSON.stringify(v)) : JSON.stringify(v);
    case 'number': return o.pyFloats && !Number.isInteger(v) ? pyFloatRepr(v) : JSON.stringify(v);
    case 'boolean': return JSON.stringify(v);
    case 'undefined': return undefinedAsNull ? 'null' : 'undefined';
    case 'object': break;
    default: return unsupported(`JSON of a ${typeof v}`);
  }
  if (v === null) return 'null';
  // indent=0 still breaks lines in json.dumps; only none (the default) writes one line.
  const unit = o.indent !== null ? ' '.repeat(o.indent) : '';
  const base = '\n' + unit.repeat(depth);
  const child = base + unit;
  if (Array.isArray(v)) {
    const core = v.map((x) => toJson(x, o, depth + 1, undefinedAsNull));
    return o.indent !== null && core.length > 0 ? `[${child}${core.join(o.itemSep + child)}${base}]` : `[${core.join(o.itemSep)}]`;
  }
  let entries: [string, unknown][];
  if (v instanceof Namespace) entries = Array.from(v.vals.entries());
  else if (v instanceof Special) return unsupported('JSON of a tuple, loop or macro');
  else entries = Object.entries(v);
  if (o.sortKeys) entries.sort(([a], [b]) => pyCompare(a, b));
  const core = entries.map(([k, x]) => {
    const key = o.ascii ? asciiOnly(JSON.stringify(k)) : JSON.stringify(k);
    const item = key + o.keySep + toJson(x, o, depth + 1, undefinedAsNull);
    return o.indent !== null ? child + item : item;
  });
  return o.indent !== null && core.length > 0 ? `{${core.join(o.itemSep)}${base}}` : `{${core.join(o.itemSep)}}`;
}

/** Values deep-copied and frozen by `freezePlain`: their JSON text can be kept. */
const frozenPlain = new WeakSet<object>();
const TOJSON_MEMO = new WeakMap<object, string>();

function tojson(v: unknown, o: JsonOptions, memo: WeakMap<object, string> | null): string {
  if (memo !== null && typeof v === 'object' && v !== null && frozenPlain.has(v)) {
    let text = memo.get(v);
    if (text === undefined) memo.set(v, (text = toJson(v, o, 0, true)));
    return text;
  }
  return toJson(v, o, 0, true);
}

/**
 * A deep, frozen copy of a JSON-like value for the `context` of many renders (a tool list that
 * agents resend every turn): nothing can change it, so `tojson` of it and of its parts is computed
 * once per distinct text and kept.
 */
export function freezePlain<T>(value: T): T {
  return freezeDeep(value) as T;
}

function freezeDeep(value: unknown): unknown {
  if (typeof value !== 'object' || value === null) return value;
  const copy: object = Array.isArray(value) ? value.map(freezeDeep) : Object.fromEntries(Object.entries(value).map(([k, v]) => [k, freezeDeep(v)]));
  Object.freeze(copy);
  frozenPlain.add(copy);
  return copy;
}

function jsonOptions(indent: unknown, ascii: unknown, sortKeys: unknown, separators: unknown): JsonOptions {
  let width: number | null = null;
  if (indent !== null && indent !== MISSING) {
    if (!isInt(indent) || indent < 0) unsupported('tojson indent');
    width = indent;
  }
  if (ascii !== MISSING && typeof ascii !== 'boolean') unsupported('tojson ensure_ascii');
  if (sortKeys !== MISSING && typeof sortKeys !== 'boolean') unsupported('tojson sort_keys');
  let itemSep = width !== null ? ',' : ', ';
  let keySep = ': ';
  if (separators !== null && separators !== MISSING) {
    const pair = listItems(separators);
    if (pair === null || pair.length !== 2 || typeof pair[0] !== 'string' || typeof pair[1] !== 'string') unsupported('tojson separators');
    itemSep = pair[0];
    keySep = pair[1];
  }
  return { indent: width, ascii: ascii === true, sortKeys: sortKeys === true, itemSep, keySep, pyFloats: true };
}

// ---------------------------------------------------------------------------------------------
// Scopes
//
// The interpreter's environments form a chain; `set` writes the innermost, lookups walk outwards,
// and a macro body's chain continues at the *call site* (dynamic scoping). Each scope-making
// construct gets a Kind at compile time listing the names that can be bound in it, so a scope is a
// slot array and most lookups are an index; lookups that leave a macro body walk the runtime chain.

const UNSET = Symbol('unset');
const MISSING = Symbol('missing');
const BREAK = 1;
const CONTINUE = 2;

class Kind {
  readonly slots = new Map<string, number>();
  readonly init: unknown[] = [];
  /** `parent`: the lexically enclosing kind; `dynamic`: a macro body, whose parent is the caller's scope. */
  constructor(readonly parent: Kind | null, readonly dynamic: boolean) {}

  slot(name: string): number {
    let i = this.slots.get(name);
    if (i === undefined) {
      i = this.init.length;
      this.slots.set(name, i);
      this.init.push(UNSET);
    }
    return i;
  }
}

interface RenderState {
  readonly ctx: Readonly<Record<string, unknown>>;
  /** Context values of the names the template reads, by `Compiler.ctxIndex`. */
  readonly g: unknown[];
  /** A pending `break`/`continue`: set by the statement, cleared by its loop. */
  ctl: number;
}

class Scope {
  readonly v: unknown[];
  constructor(readonly kind: Kind, readonly parent: Scope | null, readonly st: RenderState) {
    this.v = kind.init.slice();
  }
}

type Ev = (s: Scope) => unknown;
type Ex = (s: Scope) => string;
type FilterFn = (v: unknown, s: Scope) => unknown;
type Tail = (st: RenderState) => unknown;

interface Param { name: string; slot: number; dflt: Ev | null }
interface FrameDef { kind: Kind; params: Param[]; body: Ex }

function dynamicLookup(start: Scope | null, name: string, st: RenderState, tail: Tail): unknown {
  for (let sc = start; sc !== null; sc = sc.parent) {
    const i = sc.kind.slots.get(name);
    if (i !== undefined) {
      const v = sc.v[i];
      if (v !== UNSET) return v;
    }
  }
  return tail(st);
}

const NO_VALUES: unknown[] = [];

/** The interpreter's bindMacroArguments, for macros and call blocks without kwargs/varargs. */
function invokeFrame(def: FrameDef, pos: readonly unknown[], kwNames: readonly string[], kw: readonly unknown[], parent: Scope): string {
  const sc = new Scope(def.kind, parent, parent.st);
  const ps = def.params;
  if (pos.length > ps.length) unsupported('too many positional arguments');
  let used = 0;
  let pending = false;
  for (let i = 0; i < ps.length; i++) {
    const p = ps[i]!;
    if (i < pos.length) {
      sc.v[p.slot] = pos[i];
      continue;
    }
    const k = kwNames.length === 0 ? -1 : kwNames.indexOf(p.name);
    if (k >= 0) {
      sc.v[p.slot] = kw[k];
      used++;
      continue;
    }
    sc.v[p.slot] = undefined;
    if (p.dflt !== null) pending = true;
  }
  if (used !== kwNames.length) unsupported('unexpected keyword argument');
  if (pending) {
    for (let i = pos.length; i < ps.length; i++) {
      const p = ps[i]!;
      if (p.dflt !== null && (kwNames.length === 0 || kwNames.indexOf(p.name) < 0)) sc.v[p.slot] = p.dflt(sc);
    }
  }
  return def.body(sc);
}

function callValue(fn: unknown, pos: readonly unknown[], kwNames: readonly string[], kw: readonly unknown[], s: Scope): unknown {
  if (fn instanceof MacroValue) return invokeFrame(fn.def, pos, kwNames, kw, s);
  if (fn instanceof CallerValue) return invokeFrame(fn.def, pos, kwNames, kw, fn.scope);
  if (fn instanceof Builtin) return callBuiltin(fn.name, pos, kwNames, kw);
  return unsupported('calling something that is not a macro');
}

function callBuiltin(name: BuiltinName, pos: readonly unknown[], kwNames: readonly string[], kw: readonly unknown[]): unknown {
  switch (name) {
    case 'namespace': {
      if (pos.length > 1) unsupported('namespace with several positional arguments');
      const ns = new Namespace();
      if (pos.length === 1) {
        const src = pos[0];
        if (!isPlain(src)) unsupported('namespace from a value that is not a mapping');
        for (const k of Object.keys(src)) ns.vals.set(k, src[k]);
      }
      for (let i = 0; i < kwNames.length; i++) ns.vals.set(kwNames[i]!, kw[i]);
      return ns;
    }
    case 'range': {
      if (kwNames.length > 0 || pos.length === 0 || pos.length > 3 || !pos.every(isInt)) unsupported('range arguments');
      const nums = pos as readonly number[];
      const [start, stop] = nums.length === 1 ? [0, nums[0]!] : [nums[0]!, nums[1]!];
      const step = nums[2] ?? 1;
      if (step === 0) unsupported('range step 0');
      const out: number[] = [];
      if (step > 0) for (let i = start; i < stop; i += step) out.push(i);
      else for (let i = start; i > stop; i += step) out.push(i);
      return out;
    }
    case 'strftime_now': {
      if (kwNames.length > 0 || typeof pos[0] !== 'string') unsupported('strftime_now arguments');
      return strftimeNow(pos[0]);
    }
    case 'raise_exception':
      return unsupported('raise_exception');
  }
}

let monthFormats: { long: Intl.DateTimeFormat; short: Intl.DateTimeFormat } | null = null;

/** The interpreter's strftime_now: %Y %m %d %b %B %H %M %% in local time, other codes verbatim. */
function strftimeNow(format: string): string {
  monthFormats ??= { long: new Intl.DateTimeFormat(undefined, { month: 'long' }), short: new Intl.DateTimeFormat(undefined, { month: 'short' }) };
  const { long, short } = monthFormats;
  const date = new Date();
  const two = (n: number): string => (n < 10 ? '0' + n : String(n));
  return format.replace(/%[YmdbBHM%]/g, (code) => {
    switch (code) {
      case '%Y': return String(date.getFullYear());
      case '%m': return two(date.getMonth() + 1);
      case '%d': return two(date.getDate());
      case '%b': return short.format(date);
      case '%B': return long.format(date);
      case '%H': return two(date.getHours());
      case '%M': return two(date.getMinutes());
      default: return '%';
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Operations

/**
 * Python's `==`, which transformers' jinja2 uses (jinja-compat.ts gives the interpreter the same):
 * lists and mappings compare by value, numbers and booleans as numbers, a string equals only a
 * string, none only none and undefined only undefined. The interpreter's own `==` compared lists
 * and mappings by identity, so a Mistral template's `message == user_messages[-1]` picked out
 * every user turn with the same text as the last one in Python and only the last one here.
 */
function pyEquals(a: unknown, b: unknown): boolean {
  if (a === b) {
    if (a instanceof Callable) unsupported('comparing macros');
    return true;
  }
  switch (typeof a) {
    case 'string': return false;
    case 'number':
    case 'boolean': return (typeof b === 'number' || typeof b === 'boolean') && Number(a) === Number(b);
    case 'undefined': return false;
    case 'object': break;
    default: return unsupported(`== on a ${typeof a}`);
  }
  if (a === null || typeof b !== 'object' || b === null) return false;
  if (a instanceof LoopInfo || b instanceof LoopInfo || a instanceof Callable || b instanceof Callable) unsupported('== with loop or a macro');
  if (Array.isArray(a) || Array.isArray(b)) return Array.isArray(a) && Array.isArray(b) && sameItems(a, b);
  if (a instanceof Tuple || b instanceof Tuple) return a instanceof Tuple && b instanceof Tuple && sameItems(a.items, b.items);
  // A namespace equals only itself.
  if (a instanceof Namespace || b instanceof Namespace) return false;
  const ka = Object.keys(a);
  if (ka.length !== Object.keys(b).length) return false;
  for (const k of ka) if (!hasOwn(b, k) || !pyEquals((a as Plain)[k], (b as Plain)[k])) return false;
  return true;
}

function sameItems(a: readonly unknown[], b: readonly unknown[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (!pyEquals(a[i], b[i])) return false;
  return true;
}

/** The checks the interpreter makes before any operator but and/or/==/!=. */
function definedOperands(l: unknown, r: unknown, op: string): void {
  if (l === undefined || r === undefined || l === null || r === null) unsupported(`${op} on an undefined or none value`);
}

function contains(l: unknown, r: unknown): boolean {
  if (r === undefined) return false;
  definedOperands(l, r, 'in');
  const items = listItems(r);
  if (items !== null) {
    for (const x of items) if (pyEquals(l, x)) return true;
    return false;
  }
  if (typeof l === 'string') {
    if (typeof r === 'string') return r.includes(l);
    if (isPlain(r)) return hasOwn(r, l);
  }
  return unsupported('in between these types');
}

function add(l: unknown, r: unknown): unknown {
  if (typeof l === 'string' && typeof r === 'string') return l + r;
  definedOperands(l, r, '+');
  if (typeof l === 'number' && typeof r === 'number') {
    const x = l + r;
    return Number.isInteger(l) && Number.isInteger(r) ? intResult(x) : floatResult(x);
  }
  if (Array.isArray(l) && Array.isArray(r)) return l.concat(r);
  // Also a string and anything else: a TypeError in Python, which the interpreter raises too (jinja-compat.ts).
  return unsupported('+ between these types');
}

function arith(op: string): (l: unknown, r: unknown) => unknown {
  const check = (l: unknown, r: unknown): void => {
    definedOperands(l, r, op);
    if (typeof l !== 'number' || typeof r !== 'number') unsupported(`${op} on values that are not numbers`);
  };
  const ints = (a: number, b: number): boolean => Number.isInteger(a) && Number.isInteger(b);
  switch (op) {
    case '-': return (l, r) => { check(l, r); const a = l as number; const b = r as number; return ints(a, b) ? intResult(a - b) : floatResult(a - b); };
    case '*': return (l, r) => { check(l, r); const a = l as number; const b = r as number; return ints(a, b) ? intResult(a * b) : floatResult(a * b); };
    case '/': return (l, r) => { check(l, r); return floatResult((l as number) / (r as number)); };
    case '//': return (l, r) => { check(l, r); const a = l as number; const b = r as number; const x = Math.floor(a / b); return ints(a, b) ? intResult(x) : floatResult(x); };
    case '%': return (l, r) => { check(l, r); const a = l as number; const b = r as number; return ints(a, b) ? intResult(pyMod(a, b)) : floatResult(pyMod(a, b)); };
    case '<': return (l, r) => { check(l, r); return (l as number) < (r as number); };
    case '>': return (l, r) => { check(l, r); return (l as number) > (r as number); };
    case '<=': return (l, r) => { check(l, r); return (l as number) <= (r as number); };
    case '>=': return (l, r) => { check(l, r); return (l as number) >= (r as number); };
  }
  return refuse(`operator ${op}`);
}

/** Python's `%`: the result takes the divisor's sign (`-7 % 3` is 2; JS's is -1); jinja-compat.ts too. */
export function pyMod(a: number, b: number): number {
  const r = a % b;
  if (r === 0) return b < 0 ? -0 : 0;
  return r < 0 !== b < 0 ? r + b : r;
}

function power(l: unknown, r: unknown): unknown {
  definedOperands(l, r, '**');
  const num = (v: unknown): number => (typeof v === 'boolean' ? Number(v) : typeof v === 'number' ? v : unsupported('** on values that are not numbers'));
  const a = num(l);
  const b = num(r);
  if (a === 0 && b < 0) unsupported('0 to a negative power');
  const x = a ** b;
  if (!Number.isFinite(x)) unsupported('** result is not finite');
  const float = (typeof l === 'number' && !Number.isInteger(l)) || (typeof r === 'number' && !Number.isInteger(r)) || b < 0;
  return float ? floatResult(x) : intResult(x);
}

/** `~`: Python's str() of each side, an undefined one being the empty string (jinja-compat.ts too). */
function concat(l: unknown, r: unknown): string {
  if (typeof l === 'string' && typeof r === 'string') return l + r;
  return concatPart(l) + concatPart(r);
}

function concatPart(v: unknown): string {
  if (v === undefined) return '';
  if (typeof v === 'object' && v !== null) unsupported('~ with a list or mapping');
  if (typeof v !== 'string' && typeof v !== 'number' && typeof v !== 'boolean' && v !== null) unsupported(`~ with a ${typeof v}`);
  return pyScalar(v);
}

function getAttr(o: unknown, name: string): unknown {
  if (typeof o === 'object' && o !== null) {
    if (Array.isArray(o)) return name === 'length' ? o.length : undefined;
    if (o instanceof Special) return o.attr(name);
    if (hasOwn(o, name)) return (o as Plain)[name];
    if (OBJECT_METHODS.has(name)) unsupported(`mapping method ${name} used as a value`);
    return undefined;
  }
  if (typeof o === 'string') {
    if (name === 'length') return o.length;
    if (STRING_METHODS.has(name)) unsupported(`string method ${name} used as a value`);
    return undefined;
  }
  if (typeof o === 'function' || typeof o === 'symbol' || typeof o === 'bigint') unsupported(`attribute of a ${typeof o}`);
  return undefined;
}

/**
 * `o[k]`. jinja2 answers undefined wherever Python's lookup fails (a list, a mapping or none
 * subscripted with a key it cannot take); only an undefined `o` raises. Hermes' tool template
 * looks up `type_map[json_spec.type]` with a list of types (`["string", "null"]`), which the
 * interpreter refused (jinja-compat.ts gives it jinja2's answer).
 */
function getItem(o: unknown, k: unknown): unknown {
  if (typeof k === 'string') return getAttr(o, k);
  if (o === undefined) return unsupported('subscript of an undefined value');
  const index = typeof k === 'boolean' ? Number(k) : k;
  if (isInt(index)) {
    if (Array.isArray(o)) return o.at(index);
    // Code points, as Python indexes a str (JS's `at` counts UTF-16 units).
    if (typeof o === 'string') return pyCharAt(o, index);
    if (o instanceof Tuple) return o.items.at(index);
  }
  return undefined;
}

function sliceList<T>(a: readonly T[], start: number | undefined, stop: number | undefined, step: number | undefined): T[] {
  const n = a.length;
  const by = step ?? 1;
  const dir = Math.sign(by);
  let from: number;
  let to: number;
  if (dir >= 0) {
    from = start === undefined ? 0 : start < 0 ? Math.max(n + start, 0) : Math.min(start, n);
    to = stop === undefined ? n : stop < 0 ? Math.max(n + stop, 0) : Math.min(stop, n);
  } else {
    from = start === undefined ? n - 1 : start < 0 ? Math.max(n + start, -1) : Math.min(start, n - 1);
    to = stop === undefined ? -1 : stop < -1 ? Math.max(n + stop, -1) : Math.min(stop, n - 1);
  }
  const out: T[] = [];
  for (let i = from; dir * i < dir * to; i += by) out.push(a[i]!);
  return out;
}

function sliceBound(v: unknown): number | undefined {
  if (v === undefined || isInt(v)) return v;
  return unsupported('slice bound that is not an integer');
}

/** The interpreter's compareRuntimeValues (sort). */
function compareValues(a: unknown, b: unknown, caseSensitive: boolean): number {
  if (a === null && b === null) return 0;
  if (a === null || b === null) unsupported('comparing none');
  if (a === undefined && b === undefined) return 0;
  if (a === undefined || b === undefined) unsupported('comparing undefined');
  const numA = typeof a === 'number' || typeof a === 'boolean';
  const numB = typeof b === 'number' || typeof b === 'boolean';
  if (numA && numB) {
    const x = Number(a);
    const y = Number(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (typeof a === 'string' && typeof b === 'string') {
    const x = caseSensitive ? a : a.toLowerCase();
    const y = caseSensitive ? b : b.toLowerCase();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  return unsupported('comparing these types');
}

/** The interpreter's getAttributeValue: a dotted path through mappings and list indices. */
function attrPath(item: unknown, path: string): unknown {
  let v = item;
  for (const part of path.split('.')) {
    if (isPlain(v)) v = hasOwn(v, part) ? v[part] : undefined;
    else if (v instanceof Namespace) v = v.vals.get(part);
    else if (v instanceof LoopInfo) unsupported('attribute path through loop');
    else {
      const items = listItems(v);
      if (items === null) return undefined;
      const i = parseInt(part, 10);
      if (isNaN(i) || i < 0 || i >= items.length) return undefined;
      v = items[i];
    }
  }
  return v;
}

/** `join`: Python's str() of each item (None, True, 1e-05, a list's repr), as jinja2 joins them (jinja-compat.ts too). */
function joinItems(items: readonly unknown[], sep: string): string {
  let out = '';
  for (let i = 0; i < items.length; i++) {
    if (i > 0) out += sep;
    const x = items[i];
    if (x !== undefined) out += typeof x === 'string' ? x : toStr(x);
  }
  return out;
}

function indentText(text: string, width: string, first: boolean, blank: boolean): string {
  return text.split('\n').map((line, i) => ((!first && i === 0) || (!blank && line.length === 0) ? line : width + line)).join('\n');
}

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

const replaceRegExps = new Map<string, RegExp>();

/** The interpreter's str.replace: a literal match under the `u` flag, at most `count` times. */
function replaceText(s: string, from: string, to: string, count: number | null): string {
  if (count === 0) return s;
  let re = replaceRegExps.get(from);
  if (re === undefined) {
    re = new RegExp(from.length === 0 ? '(?=)' : escapeRegExp(from), 'gu');
    if (replaceRegExps.size < 256) replaceRegExps.set(from, re);
  }
  let left = count === null || count < 0 ? Infinity : count;
  return s.replaceAll(re, (m) => (left-- > 0 ? to : m));
}

function splitText(s: string, sep: unknown, maxsplit: unknown): string[] {
  if (sep !== null && typeof sep !== 'string') unsupported('split separator');
  if (!isInt(maxsplit)) unsupported('split maxsplit');
  if (sep === null) return pySplitWhitespace(s, maxsplit);
  if (sep === '') unsupported('empty separator');
  const out = s.split(sep);
  if (maxsplit !== -1 && out.length > maxsplit) out.push(out.splice(maxsplit).join(sep));
  return out;
}

function affix(s: string, pattern: unknown, starts: boolean): boolean {
  if (typeof pattern === 'string') return starts ? s.startsWith(pattern) : s.endsWith(pattern);
  const items = listItems(pattern);
  if (items === null) return unsupported('startswith/endswith argument');
  for (const p of items) {
    if (typeof p !== 'string') unsupported('startswith/endswith tuple element');
    if (starts ? s.startsWith(p) : s.endsWith(p)) return true;
  }
  return false;
}

/** Python's `str.strip([chars])`, which takes no keywords; anything else is a TypeError there. */
function stripText(o: string, name: string, pos: readonly unknown[], kwNames: readonly string[]): string {
  if (kwNames.length > 0 || pos.length > 1) unsupported(`${name} arguments`);
  const chars = pos.length > 0 ? pos[0] : null;
  if (chars !== null && typeof chars !== 'string') unsupported(`${name} argument`);
  return pyStrip(o, chars, name !== 'rstrip', name !== 'lstrip');
}

function callStringMethod(o: string, name: string, pos: readonly unknown[], kwNames: readonly string[], kw: readonly unknown[]): unknown {
  switch (name) {
    case 'upper': return o.toUpperCase();
    case 'lower': return o.toLowerCase();
    case 'strip':
    case 'lstrip':
    case 'rstrip': return stripText(o, name, pos, kwNames);
    case 'title': return pyTitle(o);
    case 'capitalize': return pyCapitalize(o);
    case 'startswith':
    case 'endswith':
      if (pos.length === 0) unsupported(`${name} without a positional argument`);
      return affix(o, pos[0], name === 'startswith');
    case 'split':
      if (kwNames.length > 0 && pos.length < 2) unsupported('split with keyword arguments');
      return splitText(o, pos.length > 0 ? pos[0] : null, pos.length > 1 ? pos[1] : -1);
    case 'replace': {
      if (pos.length < 2 || typeof pos[0] !== 'string' || typeof pos[1] !== 'string') unsupported('replace arguments');
      const count = pos.length > 2 ? pos[2] : kwArg(kwNames, kw, 'count', null);
      if (count !== null && !isInt(count)) unsupported('replace count');
      return replaceText(o, pos[0], pos[1], count);
    }
  }
  return unsupported(`string method ${name}`);
}

function kwArg(kwNames: readonly string[], kw: readonly unknown[], name: string, absent: unknown): unknown {
  const i = kwNames.indexOf(name);
  return i < 0 ? absent : kw[i];
}

function itemPairs(o: Plain): unknown[][] {
  return Object.keys(o).map((k) => [k, o[k]]);
}

function callObjectMethod(o: Plain, name: string, pos: readonly unknown[], kwNames: readonly string[]): unknown {
  switch (name) {
    case 'get': {
      const key = pos[0];
      if (typeof key !== 'string') unsupported('get key');
      if (hasOwn(o, key)) return o[key];
      if (pos.length > 1) return pos[1];
      if (kwNames.length > 0) unsupported('get with keyword arguments');
      return null;
    }
    case 'items': return itemPairs(o);
    case 'keys': return Object.keys(o);
    case 'values': return Object.values(o);
  }
  return unsupported(`mapping method ${name}`);
}

function callMethod(o: unknown, name: string, pos: readonly unknown[], kwNames: readonly string[], kw: readonly unknown[]): unknown {
  if (typeof o === 'string' && STRING_METHODS.has(name)) return callStringMethod(o, name, pos, kwNames, kw);
  if (isPlain(o) && OBJECT_METHODS.has(name) && !hasOwn(o, name)) return callObjectMethod(o, name, pos, kwNames);
  return unsupported(`method ${name} on this type`);
}

// ---------------------------------------------------------------------------------------------
// Tests (`is ...`) and filters (`| ...`)

const TESTS: Record<string, (v: unknown) => boolean> = {
  boolean: (v) => typeof v === 'boolean',
  // jinja2's undefined has a __call__ (that raises), so Python's callable() holds for it.
  callable: (v) => (typeof v === 'function' ? unsupported('callable test on a function') : v instanceof Callable || v === undefined),
  odd: (v) => (isInt(v) ? v % 2 !== 0 : unsupported('odd on a non-integer')),
  even: (v) => (isInt(v) ? v % 2 === 0 : unsupported('even on a non-integer')),
  false: (v) => v === false,
  true: (v) => v === true,
  none: (v) => v === null,
  string: (v) => typeof v === 'string',
  // A bool is a Number in Python (`true is number`); not an integer to jinja2's test, though.
  number: (v) => typeof v === 'number' || typeof v === 'boolean',
  integer: (v) => isInt(v),
  // jinja2 iterates a mapping (its keys) and undefined (nothing), and takes both for sequences
  // (Hermes' json_to_python_type tests a missing `type` with `is iterable`); jinja-compat.ts too.
  iterable: (v) => v === undefined || Array.isArray(v) || v instanceof Tuple || typeof v === 'string' || isPlain(v) || v instanceof LoopInfo,
  mapping: (v) => isPlain(v) || v instanceof LoopInfo,
  sequence: (v) => v === undefined || Array.isArray(v) || v instanceof Tuple || typeof v === 'string' || isPlain(v) || v instanceof LoopInfo,
  lower: (v) => typeof v === 'string' && pyIsLower(v),
  upper: (v) => typeof v === 'string' && pyIsUpper(v),
  defined: (v) => v !== undefined,
  undefined: (v) => v === undefined,
  // Unary here: the interpreter reads the missing second operand and throws.
  equalto: () => unsupported('equalto without an operand'),
  eq: () => unsupported('eq without an operand'),
};

/**
 * Filters jinja2 applies to an undefined value as to an empty string or list (jinja-compat.ts
 * too); the interpreter refused them all. `tojson` of undefined is a TypeError in Python.
 */
const OF_UNDEFINED: Record<string, () => unknown> = {
  length: () => 0, list: () => [], join: () => '', string: () => '', lower: () => '', upper: () => '', capitalize: () => '', title: () => '',
  map: () => [], selectattr: () => [], rejectattr: () => [], items: () => [], reverse: () => [], sort: () => [], first: () => undefined, last: () => undefined,
};

/** Filters the interpreter implements that are not reproduced here: such a template keeps the interpreter. */
const REFUSED_FILTERS = new Set(['unique', 'dictsort']);

const identity = (v: unknown): unknown => v;

function stringOnly(name: string, f: (s: string) => unknown): FilterFn {
  return (v) => (typeof v === 'string' ? f(v) : unsupported(`${name} on a non-string`));
}

function identFilter(name: string): FilterFn {
  switch (name) {
    case 'safe': return identity;
    case 'tojson': return (v) => tojson(v, JSON_TOJSON, TOJSON_MEMO);
    case 'list': return (v) => (listItems(v) !== null ? v : unsupported('list of this type'));
    case 'first': return (v) => {
      const items = listItems(v);
      return items !== null && items.length > 0 ? items[0] : unsupported('first of an empty list or other type');
    };
    case 'last': return (v) => {
      const items = listItems(v);
      return items !== null && items.length > 0 ? items[items.length - 1] : unsupported('last of an empty list or other type');
    };
    case 'length': return (v) => {
      if (typeof v === 'string') return pyLen(v);
      const items = listItems(v);
      if (items !== null) return items.length;
      if (isPlain(v)) return Object.keys(v).length;
      if (v instanceof LoopInfo) return 9;
      return unsupported('length of this type');
    };
    case 'reverse': return (v) => {
      const items = listItems(v);
      return items !== null ? items.slice().reverse() : unsupported('reverse of this type');
    };
    case 'sort': return (v) => {
      const items = listItems(v);
      return items !== null ? items.slice().sort((a, b) => compareValues(a, b, false)) : unsupported('sort of this type');
    };
    case 'join': return (v) => {
      if (typeof v === 'string') return v;
      const items = listItems(v);
      return items !== null ? joinItems(items, '') : unsupported('join of this type');
    };
    case 'string': return (v) => {
      switch (typeof v) {
        case 'string':
        case 'number':
        case 'boolean': return pyScalar(v);
      }
      if (v === null) return 'None';
      return Array.isArray(v) || isPlain(v) ? pyRepr(v) : unsupported('string of this type');
    };
    case 'trim': return (v) => (typeof v === 'string' ? pyStrip(v, null, true, true) : v === undefined ? '' : unsupported('trim of this type'));
    case 'upper': return stringOnly(name, (s) => s.toUpperCase());
    case 'lower': return stringOnly(name, (s) => s.toLowerCase());
    case 'title': return stringOnly(name, jinjaTitle);
    case 'capitalize': return stringOnly(name, pyCapitalize);
    case 'indent': return stringOnly(name, (s) => indentText(s, '    ', false, false));
    case 'int': return (v) => {
      if (typeof v === 'string') {
        const n = parseInt(v, 10);
        return isNaN(n) ? 0 : n;
      }
      if (typeof v === 'number') return intResult(Math.floor(v));
      if (typeof v === 'boolean') return v ? 1 : 0;
      return unsupported('int of this type');
    };
    case 'float': return (v) => {
      if (typeof v === 'string') return floatResult(parseFloat(v) || 0);
      if (typeof v === 'number') return floatResult(v);
      return unsupported('float of this type');
    };
    case 'abs': return (v) => (typeof v === 'number' ? Math.abs(v) : unsupported('abs of this type'));
    case 'bool': return (v) => (typeof v === 'boolean' ? v : unsupported('bool of this type'));
    case 'items': return (v) => (isPlain(v) ? itemPairs(v) : unsupported('items of this type'));
    case 'keys': return (v) => (isPlain(v) ? Object.keys(v) : unsupported('keys of this type'));
    case 'values': return (v) => (isPlain(v) ? Object.values(v) : unsupported('values of this type'));
  }
  if (REFUSED_FILTERS.has(name)) refuse(`filter ${name}`);
  // Not a filter of the interpreter's: it throws whenever this runs.
  return () => unsupported(`unknown filter ${name}`);
}

// ---------------------------------------------------------------------------------------------
// Compiler

interface Args {
  pos: Ev[];
  kwNames: string[];
  kw: Ev[];
  /** The values when every argument is a literal. */
  constant: { pos: unknown[]; kw: unknown[] } | null;
}

function evalAll(fs: readonly Ev[], s: Scope): unknown[] {
  if (fs.length === 0) return NO_VALUES;
  const out = new Array<unknown>(fs.length);
  for (let i = 0; i < fs.length; i++) out[i] = fs[i]!(s);
  return out;
}

/** A new array (a list value of its own, unlike `evalAll`'s shared empty one). */
function evalFresh(fs: readonly Ev[], s: Scope): unknown[] {
  const out = new Array<unknown>(fs.length);
  for (let i = 0; i < fs.length; i++) out[i] = fs[i]!(s);
  return out;
}

const EMPTY: Ex = () => '';

function paramName(p: N): string {
  if (p.type === 'Identifier') return (p as IdentN).value;
  if (p.type === 'KeywordArgumentExpression') return (p as KwargN).key.value;
  return refuse(`parameter ${p.type}`);
}

/** Whether a `break`/`continue` can leave these statements (to the enclosing loop). */
function signals(stmts: readonly N[]): boolean {
  return stmts.some((st) => {
    switch (st.type) {
      case 'Break':
      case 'Continue': return true;
      case 'If': return signals((st as IfN).body) || signals((st as IfN).alternate);
      case 'Set': return signals((st as SetN).body);
      case 'FilterStatement': return signals((st as FilterStmtN).body);
      case 'For': return signals((st as ForN).defaultBlock);
      default: return false;
    }
  });
}

class Compiler {
  readonly root = new Kind(null, false);
  private readonly bound = new Set<string>();
  private readonly forKinds = new Map<N, { body: Kind; filter: Kind | null }>();
  private readonly macroKinds = new Map<N, Kind>();
  private readonly callKinds = new Map<N, { site: Kind; body: Kind }>();
  /** Context names the template reads, read once per render into `RenderState.g`. */
  readonly ctxNames: string[] = [];
  private readonly ctxIndexes = new Map<string, number>();

  compile(program: { body: N[] }): Ex {
    this.analyze(program.body, this.root);
    return this.block(program.body, this.root, false);
  }

  // -- pass 1: which names each scope kind can hold

  private bind(name: string, kind: Kind): void {
    if (name === 'namespace') refuse('binding the name namespace');
    if (name === 'kwargs' || name === 'varargs') refuse(`macro ${name}`);
    kind.slot(name);
    this.bound.add(name);
  }

  private bindTarget(target: N, kind: Kind): void {
    if (target.type === 'Identifier') this.bind((target as IdentN).value, kind);
    else if (target.type === 'TupleLiteral') {
      for (const el of (target as LitN<N[]>).value) {
        if (el.type !== 'Identifier') refuse('unpacking into something that is not a name');
        this.bind((el as IdentN).value, kind);
      }
    } else if (target.type !== 'MemberExpression') refuse(`assignment to ${target.type}`);
  }

  private analyze(stmts: readonly N[], kind: Kind): void {
    for (const st of stmts) {
      switch (st.type) {
        case 'Set': {
          const n = st as SetN;
          this.bindTarget(n.assignee, kind);
          this.analyze(n.body, kind);
          break;
        }
        case 'If':
          this.analyze((st as IfN).body, kind);
          this.analyze((st as IfN).alternate, kind);
          break;
        case 'For': {
          const n = st as ForN;
          const body = new Kind(kind, false);
          this.bind('loop', body);
          this.bindTarget(n.loopvar, body);
          let filter: Kind | null = null;
          if (n.iterable.type === 'SelectExpression') {
            filter = new Kind(body, false);
            this.bindTarget(n.loopvar, filter);
          }
          this.forKinds.set(st, { body, filter });
          this.analyze(n.body, body);
          this.analyze(n.defaultBlock, body);
          break;
        }
        case 'Macro': {
          const n = st as MacroN;
          this.bind(n.name.value, kind);
          const frame = new Kind(null, true);
          for (const p of n.args) this.bind(paramName(p), frame);
          this.macroKinds.set(st, frame);
          this.analyze(n.body, frame);
          break;
        }
        case 'CallStatement': {
          const n = st as CallStmtN;
          const site = new Kind(kind, false);
          this.bind('caller', site);
          const body = new Kind(kind, false);
          for (const p of n.callerArgs ?? []) this.bind(paramName(p), body);
          this.callKinds.set(st, { site, body });
          this.analyze(n.body, body);
          break;
        }
        case 'FilterStatement':
          this.analyze((st as FilterStmtN).body, kind);
          break;
      }
    }
  }

  // -- pass 2: closures

  private block(stmts: readonly N[], kind: Kind, inLoop: boolean): Ex {
    const parts: Ex[] = [];
    let text: string | null = null;
    for (const st of stmts) {
      const c = this.stmt(st, kind, inLoop);
      if (typeof c === 'string') {
        text = (text ?? '') + c;
        continue;
      }
      if (text !== null) {
        const t = text;
        if (t !== '') parts.push(() => t);
        text = null;
      }
      parts.push(c);
    }
    if (text !== null && text !== '') {
      const t = text;
      parts.push(() => t);
    }
    if (signals(stmts)) {
      return (s) => {
        let out = '';
        for (let i = 0; i < parts.length; i++) {
          out += parts[i]!(s);
          if (s.st.ctl !== 0) break;
        }
        return out;
      };
    }
    switch (parts.length) {
      case 0: return EMPTY;
      case 1: return parts[0]!;
      case 2: {
        const [a, b] = parts as [Ex, Ex];
        return (s) => a(s) + b(s);
      }
      case 3: {
        const [a, b, c] = parts as [Ex, Ex, Ex];
        return (s) => a(s) + b(s) + c(s);
      }
    }
    return (s) => {
      let out = '';
      for (let i = 0; i < parts.length; i++) out += parts[i]!(s);
      return out;
    };
  }

  /** A statement: its closure, or its constant output. */
  private stmt(node: N, kind: Kind, inLoop: boolean): Ex | string {
    switch (node.type) {
      case 'StringLiteral': return (node as LitN<string>).value;
      case 'Comment': return '';
      case 'If': {
        const n = node as IfN;
        const test = this.expr(n.test, kind);
        const body = this.block(n.body, kind, inLoop);
        const alt = this.block(n.alternate, kind, inLoop);
        return (s) => (truthy(test(s)) ? body(s) : alt(s));
      }
      case 'For': return this.forLoop(node as ForN, inLoop);
      case 'Set': return this.set(node as SetN, kind, inLoop);
      case 'Macro': {
        const n = node as MacroN;
        const frame = this.macroKinds.get(node)!;
        const value = new MacroValue({ kind: frame, params: this.params(n.args, frame), body: this.block(n.body, frame, false) });
        const slot = kind.slots.get(n.name.value)!;
        return (s) => {
          s.v[slot] = value;
          return '';
        };
      }
      case 'CallStatement': return this.callBlock(node as CallStmtN, kind);
      case 'FilterStatement': {
        const n = node as FilterStmtN;
        const filter = this.filter(n.filter, kind);
        const body = this.block(n.body, kind, inLoop);
        const sig = signals(n.body);
        return (s) => {
          const text = body(s);
          if (sig && s.st.ctl !== 0) return '';
          return toStr(filter(text, s));
        };
      }
      case 'Break':
      case 'Continue': {
        if (!inLoop) refuse(`${node.type.toLowerCase()} outside a loop of the same macro`);
        const signal = node.type === 'Break' ? BREAK : CONTINUE;
        return (s) => {
          s.st.ctl = signal;
          return '';
        };
      }
    }
    const value = this.constant(node);
    if (value !== MISSING) return toStr(value);
    const e = this.expr(node, kind);
    return (s) => {
      const v = e(s);
      return typeof v === 'string' ? v : toStr(v);
    };
  }

  private params(args: readonly N[], frame: Kind): Param[] {
    return args.map((p) => {
      const name = paramName(p);
      return { name, slot: frame.slots.get(name)!, dflt: p.type === 'KeywordArgumentExpression' ? this.expr((p as KwargN).value, frame) : null };
    });
  }

  private binder(target: N, kind: Kind): (sc: Scope, item: unknown) => void {
    if (target.type === 'Identifier') {
      const slot = kind.slots.get((target as IdentN).value)!;
      return (sc, item) => {
        sc.v[slot] = item;
      };
    }
    const slots = (target as LitN<N[]>).value.map((el) => kind.slots.get((el as IdentN).value)!);
    return (sc, item) => {
      const items = item as readonly unknown[];
      for (let j = 0; j < slots.length; j++) sc.v[slots[j]!] = items[j];
    };
  }

  private forLoop(n: ForN, inLoop: boolean): Ex {
    const kinds = this.forKinds.get(n)!;
    const fk = kinds.body;
    const loopSlot = fk.slots.get('loop')!;
    let iterNode = n.iterable;
    let test: Ev | null = null;
    if (iterNode.type === 'SelectExpression') {
      test = this.expr((iterNode as SelectN).test, kinds.filter!);
      iterNode = (iterNode as SelectN).lhs;
    }
    const iter = this.expr(iterNode, fk);
    const bindBody = this.binder(n.loopvar, fk);
    const bindFilter = kinds.filter ? this.binder(n.loopvar, kinds.filter) : null;
    const unpack = n.loopvar.type === 'TupleLiteral' ? (n.loopvar as LitN<N[]>).value.length : -1;
    const bodySignals = signals(n.body);
    const body = this.block(n.body, fk, true);
    const otherwise = this.block(n.defaultBlock, fk, inLoop);
    const filterKind = kinds.filter;
    return (s) => {
      const st = s.st;
      const scope = new Scope(fk, s, st);
      const it = iter(scope);
      let items: readonly unknown[];
      if (Array.isArray(it)) items = it;
      else if (it instanceof Tuple) items = it.items;
      // jinja-compat.ts: an undefined iterable is an empty loop, as in Python's jinja2.
      else if (it === undefined) return otherwise(new Scope(fk, s, st));
      else if (isPlain(it)) items = Object.keys(it);
      else return unsupported('for over a value that is not a list or mapping');
      if (unpack >= 0) {
        for (const item of items) if (!Array.isArray(item) || item.length !== unpack) unsupported('loop unpacking');
      }
      if (test !== null) {
        const fs = new Scope(filterKind!, scope, st);
        const kept: unknown[] = [];
        for (const item of items) {
          bindFilter!(fs, item);
          if (truthy(test(fs))) kept.push(item);
        }
        items = kept;
      }
      let out = '';
      let none = true;
      for (let i = 0; i < items.length; i++) {
        scope.v[loopSlot] = new LoopInfo(items, i);
        bindBody(scope, items[i]);
        out += body(scope);
        // jinja2 keeps what an iteration printed before its break or continue, but counts only
        // iterations that ran to the end: after none did, the else block runs.
        if (bodySignals && st.ctl !== 0) {
          const signal = st.ctl;
          st.ctl = 0;
          if (signal === BREAK) break;
          continue;
        }
        none = false;
      }
      // In a scope of its own: jinja2's else block does not see the loop variables.
      if (none) out += otherwise(new Scope(fk, s, st));
      return out;
    };
  }

  private set(n: SetN, kind: Kind, inLoop: boolean): Ex {
    let rhs: Ev;
    if (n.value !== null) rhs = this.expr(n.value, kind);
    else {
      const body = this.block(n.body, kind, inLoop);
      if (signals(n.body)) {
        // A break inside the block leaves before the assignment.
        const assign = this.assign(n.assignee, kind);
        return (s) => {
          const v = body(s);
          if (s.st.ctl === 0) assign(s, v);
          return '';
        };
      }
      rhs = body;
    }
    const assign = this.assign(n.assignee, kind);
    return (s) => {
      assign(s, rhs(s));
      return '';
    };
  }

  private assign(target: N, kind: Kind): (s: Scope, v: unknown) => void {
    if (target.type === 'Identifier') {
      const slot = kind.slots.get((target as IdentN).value)!;
      return (s, v) => {
        s.v[slot] = v;
      };
    }
    if (target.type === 'TupleLiteral') {
      const slots = (target as LitN<N[]>).value.map((el) => kind.slots.get((el as IdentN).value)!);
      return (s, v) => {
        const items = listItems(v);
        if (items === null || items.length !== slots.length) unsupported('set unpacking');
        for (let j = 0; j < slots.length; j++) s.v[slots[j]!] = items[j];
      };
    }
    const m = target as MemberN;
    if (m.computed || m.property.type !== 'Identifier') refuse('set of a subscript');
    const name = (m.property as IdentN).value;
    const object = this.expr(m.object, kind);
    return (s, v) => {
      const ns = object(s);
      if (!(ns instanceof Namespace)) unsupported('set of an attribute of something that is not a namespace');
      ns.vals.set(name, v);
    };
  }

  private callBlock(n: CallStmtN, kind: Kind): Ex {
    const { site, body } = this.callKinds.get(n)!;
    const def: FrameDef = { kind: body, params: this.params(n.callerArgs ?? [], body), body: this.block(n.body, body, false) };
    const args = this.args(n.call.args, kind);
    const callee = this.expr(n.call.callee, kind);
    const callerSlot = site.slots.get('caller')!;
    return (s) => {
      const caller = new CallerValue(def, s);
      const pos = evalAll(args.pos, s);
      const kw = evalAll(args.kw, s);
      const fn = callee(s);
      if (!(fn instanceof MacroValue)) return unsupported('call block on something that is not a macro');
      const at = new Scope(site, s, s.st);
      at.v[callerSlot] = caller;
      return invokeFrame(fn.def, pos, args.kwNames, kw, at);
    };
  }

  private args(nodes: readonly N[], kind: Kind): Args {
    const pos: Ev[] = [];
    const kwNames: string[] = [];
    const kw: Ev[] = [];
    const posConst: unknown[] = [];
    const kwConst: unknown[] = [];
    let allConst = true;
    for (const a of nodes) {
      if (a.type === 'SpreadExpression' || a.type === 'KeywordSpreadExpression') refuse('argument unpacking');
      const isKw = a.type === 'KeywordArgumentExpression';
      const valueNode = isKw ? (a as KwargN).value : a;
      const c = this.constant(valueNode);
      if (c === MISSING) allConst = false;
      const e = c === MISSING ? this.expr(valueNode, kind) : () => c;
      if (isKw) {
        const name = (a as KwargN).key.value;
        if (kwNames.includes(name)) refuse(`keyword argument ${name} given twice`);
        kwNames.push(name);
        kw.push(e);
        kwConst.push(c);
      } else {
        pos.push(e);
        posConst.push(c);
      }
    }
    return { pos, kwNames, kw, constant: allConst ? { pos: posConst, kw: kwConst } : null };
  }

  /** The value of a literal expression (never a fresh object: those must not be shared), else MISSING. */
  private constant(node: N): unknown {
    if (node.type === 'StringLiteral') return (node as LitN<string>).value;
    if (node.type === 'IntegerLiteral') return (node as LitN<number>).value;
    if (node.type === 'FloatLiteral') {
      const v = (node as LitN<number>).value;
      return Number.isInteger(v) ? MISSING : v;
    }
    return MISSING;
  }

  private ctxIndex(name: string): number {
    let i = this.ctxIndexes.get(name);
    if (i === undefined) {
      i = this.ctxNames.length;
      this.ctxNames.push(name);
      this.ctxIndexes.set(name, i);
    }
    return i;
  }

  /** Where a name is found when no scope binds it: the globals, else the render's context. */
  private tail(name: string): Tail {
    if (GLOBALS.has(name)) {
      const value = GLOBALS.get(name);
      return () => value;
    }
    const i = this.ctxIndex(name);
    return (st) => st.g[i];
  }

  private lookup(name: string, kind: Kind): Ev {
    if (name === 'kwargs' || name === 'varargs') refuse(`macro ${name}`);
    const tail = this.tail(name);
    // Nothing in the template binds it (and the context may not shadow a global): a constant or a
    // context value, whatever the scope.
    if (!this.bound.has(name)) {
      if (GLOBALS.has(name)) {
        const value = GLOBALS.get(name);
        return () => value;
      }
      const i = this.ctxIndex(name);
      return (s) => s.st.g[i];
    }
    const depths: number[] = [];
    const slots: number[] = [];
    let k: Kind = kind;
    let d = 0;
    let dynamic = false;
    for (;;) {
      const slot = k.slots.get(name);
      if (slot !== undefined) {
        depths.push(d);
        slots.push(slot);
      }
      if (k.dynamic) {
        dynamic = true;
        break;
      }
      if (k.parent === null) break;
      k = k.parent;
      d++;
    }
    const frameDepth = d;
    if (!dynamic && depths.length === 1 && depths[0] === 0) {
      const slot = slots[0]!;
      return (s) => {
        const v = s.v[slot];
        return v !== UNSET ? v : tail(s.st);
      };
    }
    if (!dynamic && depths.length === 1 && depths[0] === 1) {
      const slot = slots[0]!;
      return (s) => {
        const v = s.parent!.v[slot];
        return v !== UNSET ? v : tail(s.st);
      };
    }
    return (s) => {
      let cur = s;
      let at = 0;
      for (let i = 0; i < depths.length; i++) {
        const want = depths[i]!;
        for (; at < want; at++) cur = cur.parent!;
        const v = cur.v[slots[i]!];
        if (v !== UNSET) return v;
      }
      if (!dynamic) return tail(s.st);
      for (; at < frameDepth; at++) cur = cur.parent!;
      return dynamicLookup(cur.parent, name, s.st, tail);
    };
  }

  private expr(node: N, kind: Kind): Ev {
    const c = this.constant(node);
    if (c !== MISSING) return () => c;
    switch (node.type) {
      case 'Identifier': return this.lookup((node as IdentN).value, kind);
      case 'FloatLiteral': return () => unsupported('a float literal with an integral value');
      case 'ArrayLiteral': {
        const items = (node as LitN<N[]>).value.map((x) => this.expr(x, kind));
        return (s) => evalFresh(items, s);
      }
      case 'TupleLiteral': {
        const items = (node as LitN<N[]>).value.map((x) => this.expr(x, kind));
        return (s) => new Tuple(evalFresh(items, s));
      }
      case 'ObjectLiteral': {
        const entries = Array.from((node as LitN<Map<N, N>>).value, ([k, v]) => [this.expr(k, kind), this.expr(v, kind)] as const);
        return (s) => {
          const out: Plain = {};
          for (const [k, v] of entries) {
            const key = k(s);
            if (typeof key !== 'string') unsupported('object key that is not a string');
            // A plain object puts integer-like keys first; the interpreter's Map keeps insertion order.
            if (/^\d+$/.test(key) || key === '__proto__') unsupported('object key that a plain object would reorder');
            out[key] = v(s);
          }
          return out;
        };
      }
      case 'MemberExpression': return this.member(node as MemberN, kind);
      case 'CallExpression': return this.call(node as CallN, kind);
      case 'UnaryExpression': {
        const n = node as UnaryN;
        const arg = this.expr(n.argument, kind);
        switch (n.operator.value) {
          case 'not': return (s) => !truthy(arg(s));
          case '-':
          case '+': {
            const sign = n.operator.value === '-' ? -1 : 1;
            return (s) => {
              const v = arg(s);
              if (typeof v === 'number') return sign * v;
              if (typeof v === 'boolean') return sign * Number(v);
              return unsupported('unary sign on a value that is not a number');
            };
          }
        }
        return refuse(`unary operator ${n.operator.value}`);
      }
      case 'BinaryExpression': return this.binary(node as BinaryN, kind);
      case 'FilterExpression': {
        const n = node as FilterN;
        const operand = this.expr(n.operand, kind);
        const filter = this.filter(n.filter, kind);
        return (s) => filter(operand(s), s);
      }
      case 'TestExpression': {
        const n = node as TestN;
        const operand = this.expr(n.operand, kind);
        const test = hasOwn(TESTS, n.test.value) ? TESTS[n.test.value]! : null;
        // Not a test of the interpreter's: it throws whenever this runs.
        if (test === null) return () => unsupported(`unknown test ${n.test.value}`);
        return n.negate ? (s) => !test(operand(s)) : (s) => test(operand(s));
      }
      case 'SelectExpression': {
        const n = node as SelectN;
        const test = this.expr(n.test, kind);
        const lhs = this.expr(n.lhs, kind);
        return (s) => (truthy(test(s)) ? lhs(s) : undefined);
      }
      case 'Ternary': {
        const n = node as TernaryN;
        const cond = this.expr(n.condition, kind);
        const yes = this.expr(n.trueExpr, kind);
        const no = this.expr(n.falseExpr, kind);
        return (s) => (truthy(cond(s)) ? yes(s) : no(s));
      }
    }
    return refuse(`node ${node.type}`);
  }

  private binary(n: BinaryN, kind: Kind): Ev {
    const op = n.operator.value;
    const l = this.expr(n.left, kind);
    const r = this.expr(n.right, kind);
    switch (op) {
      case 'and': return (s) => {
        const a = l(s);
        return truthy(a) ? r(s) : a;
      };
      case 'or': return (s) => {
        const a = l(s);
        return truthy(a) ? a : r(s);
      };
      case '==':
      case '!=': {
        const negate = op === '!=';
        // Comparing with a string literal (`message.role == 'user'`) is most of a chat template's logic.
        const lit = n.right.type === 'StringLiteral' ? (n.right as LitN<string>).value : n.left.type === 'StringLiteral' ? (n.left as LitN<string>).value : null;
        if (lit !== null) {
          const other = n.right.type === 'StringLiteral' ? l : r;
          return (s) => {
            const v = other(s);
            return (v === lit) !== negate;
          };
        }
        return (s) => pyEquals(l(s), r(s)) !== negate;
      }
      case 'in': return (s) => contains(l(s), r(s));
      case 'not in': return (s) => {
        const a = l(s);
        const b = r(s);
        return b === undefined ? true : !contains(a, b);
      };
      case '+': return (s) => add(l(s), r(s));
      case '~': return (s) => concat(l(s), r(s));
      case '**': return (s) => power(l(s), r(s));
    }
    const f = arith(op);
    return (s) => f(l(s), r(s));
  }

  private member(n: MemberN, kind: Kind): Ev {
    const object = this.expr(n.object, kind);
    if (!n.computed) {
      if (n.property.type === 'Identifier') {
        const name = (n.property as IdentN).value;
        if (name === '__proto__') return (s) => getAttr(object(s), name);
        // Most reads are of a plain object's own key (messages, tools). On a plain object a name
        // not its own finds Object.prototype, whose properties are all functions but __proto__.
        return (s) => {
          const o = object(s);
          if (typeof o === 'object' && o !== null && Object.getPrototypeOf(o) === Object.prototype) {
            const v = (o as Plain)[name];
            if (v !== undefined && typeof v !== 'function') return v;
          }
          return getAttr(o, name);
        };
      }
      const index = (n.property as LitN<number>).value;
      return (s) => getItem(object(s), index);
    }
    if (n.property.type === 'SliceExpression') {
      const sl = n.property as SliceN;
      const part = (p: N | undefined): Ev => (p === undefined ? () => undefined : this.expr(p, kind));
      const [start, stop, step] = [part(sl.start), part(sl.stop), part(sl.step)];
      return (s) => {
        const o = object(s);
        const items = typeof o === 'string' ? null : listItems(o);
        if (items === null && typeof o !== 'string') unsupported('slice of this type');
        const a = sliceBound(start(s));
        const b = sliceBound(stop(s));
        const c = sliceBound(step(s));
        return items !== null ? sliceList(items, a, b, c) : sliceList(Array.from(o as string), a, b, c).join('');
      };
    }
    const key = this.expr(n.property, kind);
    return (s) => {
      const o = object(s);
      return getItem(o, key(s));
    };
  }

  private call(n: CallN, kind: Kind): Ev {
    const args = this.args(n.args, kind);
    const kwNames = args.kwNames;
    const callee = n.callee;
    if (callee.type === 'MemberExpression') {
      const m = callee as MemberN;
      let name: string;
      if (!m.computed && m.property.type === 'Identifier') name = (m.property as IdentN).value;
      else if (m.computed && m.property.type === 'StringLiteral') name = (m.property as LitN<string>).value;
      else return refuse('call of a computed member');
      const object = this.expr(m.object, kind);
      if (!STRING_METHODS.has(name) && !OBJECT_METHODS.has(name)) return () => unsupported(`method ${name}`);
      if (args.constant !== null) {
        const { pos, kw } = args.constant;
        return (s) => callMethod(object(s), name, pos, kwNames, kw);
      }
      return (s) => {
        const pos = evalAll(args.pos, s);
        const kw = evalAll(args.kw, s);
        return callMethod(object(s), name, pos, kwNames, kw);
      };
    }
    if (callee.type !== 'Identifier') return refuse(`call of a ${callee.type}`);
    const fn = this.lookup((callee as IdentN).value, kind);
    return (s) => {
      const pos = evalAll(args.pos, s);
      const kw = evalAll(args.kw, s);
      return callValue(fn(s), pos, kwNames, kw, s);
    };
  }

  private filter(node: N, kind: Kind): FilterFn {
    const name = node.type === 'Identifier' ? (node as IdentN).value : node.type === 'CallExpression' && (node as CallN).callee.type === 'Identifier' ? ((node as CallN).callee as IdentN).value : null;
    const f = this.filterOf(node, kind);
    const empty = name !== null && hasOwn(OF_UNDEFINED, name) ? OF_UNDEFINED[name]! : null;
    if (name === 'tojson') return (v, s) => (v === undefined ? unsupported('tojson of an undefined value') : f(v, s));
    return empty === null ? f : (v, s) => (v === undefined ? empty() : f(v, s));
  }

  private filterOf(node: N, kind: Kind): FilterFn {
    if (node.type === 'Identifier') return identFilter((node as IdentN).value);
    if (node.type !== 'CallExpression' || (node as CallN).callee.type !== 'Identifier') return refuse(`filter ${node.type}`);
    const n = node as CallN;
    const name = (n.callee as IdentN).value;
    if (REFUSED_FILTERS.has(name)) refuse(`filter ${name}`);
    const args = this.args(n.args, kind);
    const { kwNames } = args;
    const at = (name: string): number => kwNames.indexOf(name);
    const values = (s: Scope): { pos: unknown[]; kw: unknown[] } => args.constant ?? { pos: evalAll(args.pos, s), kw: evalAll(args.kw, s) };
    /** Positional argument i, else keyword `key`, else `absent` (the interpreter's `args.at(i) ?? kwargs.get(key) ?? absent`). */
    const arg = (v: { pos: unknown[]; kw: unknown[] }, i: number, key: string | null, absent: unknown): unknown => {
      if (i < v.pos.length) return v.pos[i];
      const k = key === null ? -1 : at(key);
      return k >= 0 ? v.kw[k] : absent;
    };
    switch (name) {
      case 'tojson': {
        const options = (v: { pos: unknown[]; kw: unknown[] }): JsonOptions =>
          jsonOptions(arg(v, Infinity, 'indent', MISSING), arg(v, Infinity, 'ensure_ascii', MISSING), arg(v, Infinity, 'sort_keys', MISSING), arg(v, Infinity, 'separators', MISSING));
        if (args.constant !== null) {
          let fixed: JsonOptions;
          try {
            fixed = options(args.constant);
          } catch (err) {
            if (err instanceof Unsupported) return () => unsupported(err.reason);
            throw err;
          }
          const memo = new WeakMap<object, string>();
          return (v) => tojson(v, fixed, memo);
        }
        return (v, s) => tojson(v, options(values(s)), null);
      }
      case 'join': return (v, s) => {
        const items = typeof v === 'string' ? Array.from(v) : listItems(v);
        if (items === null) return unsupported('join of this type');
        if (kwNames.some((k) => k !== 'separator')) unsupported('join keyword arguments');
        const sep = arg(values(s), 0, 'separator', '');
        if (typeof sep !== 'string') unsupported('join separator');
        return joinItems(items, sep);
      };
      case 'int':
      case 'float': return (v, s) => {
        const a = values(s);
        const dflt = arg(a, 0, 'default', name === 'int' ? 0 : MISSING);
        if (typeof v === 'string') {
          const x = name === 'int' ? parseInt(v, 10) : parseFloat(v);
          if (isNaN(x)) return dflt === MISSING ? unsupported('float default 0.0') : dflt;
          return name === 'int' ? x : floatResult(x);
        }
        if (typeof v === 'number') return v;
        if (typeof v === 'boolean' && name === 'int') return v ? 1 : 0;
        return unsupported(`${name} of this type`);
      };
      case 'default': return (v, s) => {
        const a = values(s);
        const dflt = a.pos.length > 0 ? a.pos[0] : '';
        const boolean = arg(a, 1, 'boolean', false);
        if (typeof boolean !== 'boolean') unsupported('default flag');
        return v === undefined || (boolean && !truthy(v)) ? dflt : v;
      };
      case 'sort': return (v, s) => {
        const items = listItems(v);
        if (items === null) return unsupported('sort of this type');
        const a = values(s);
        const reverse = arg(a, 0, 'reverse', false);
        const caseSensitive = arg(a, 1, 'case_sensitive', false);
        const attribute = arg(a, 2, 'attribute', null);
        if (typeof reverse !== 'boolean' || typeof caseSensitive !== 'boolean') unsupported('sort flags');
        if (attribute !== null && typeof attribute !== 'string' && !isInt(attribute)) unsupported('sort attribute');
        const path = attribute === null ? null : String(attribute);
        const key = (x: unknown): unknown => (path === null ? x : attrPath(x, path));
        return items.slice().sort((x, y) => {
          const c = compareValues(key(x), key(y), caseSensitive);
          return reverse ? -c : c;
        });
      };
      case 'selectattr':
      case 'rejectattr': return this.selectAttr(n, name === 'selectattr');
      case 'map': return (v, s) => {
        const items = listItems(v);
        if (items === null) return unsupported('map of this type');
        const a = values(s);
        const attribute = arg(a, Infinity, 'attribute', MISSING);
        if (typeof attribute !== 'string') return unsupported('map without an attribute');
        const dflt = arg(a, Infinity, 'default', undefined);
        return items.map((item) => {
          if (!isPlain(item) && !(item instanceof Namespace)) unsupported('map over items that are not mappings');
          const x = attrPath(item, attribute);
          return x === undefined ? dflt : x;
        });
      };
      case 'indent': return (v, s) => {
        if (typeof v !== 'string') return unsupported('indent of this type');
        const a = values(s);
        const width = arg(a, 0, 'width', 4);
        if (!isInt(width) || width < 0) unsupported('indent width');
        return indentText(v, ' '.repeat(width), !!arg(a, 1, 'first', false), !!arg(a, 2, 'blank', false));
      };
      case 'replace': return (v, s) => {
        if (typeof v !== 'string') return unsupported('replace of this type');
        const a = values(s);
        if (a.pos.length < 2 || typeof a.pos[0] !== 'string' || typeof a.pos[1] !== 'string') unsupported('replace arguments');
        const count = a.pos.length > 2 ? a.pos[2] : arg(a, Infinity, 'count', null);
        if (count !== null && !isInt(count)) unsupported('replace count');
        return replaceText(v, a.pos[0], a.pos[1], count);
      };
      case 'items':
      case 'keys':
      case 'values':
      case 'get': return (v, s) => {
        if (!isPlain(v)) return unsupported(`${name} of this type`);
        const a = values(s);
        return callObjectMethod(v, name, a.pos, kwNames);
      };
    }
    // Not a filter of the interpreter's in call form: it throws whenever this runs.
    return () => unsupported(`unknown filter ${name}`);
  }

  private selectAttr(n: CallN, select: boolean): FilterFn {
    const lits = n.args.map((a) => (a.type === 'StringLiteral' ? (a as LitN<string>).value : null));
    const [attr, testName, operand] = lits;
    if (lits.some((x) => x === null) || attr === undefined) return () => unsupported('selectattr arguments');
    let test: (x: unknown) => boolean;
    if (testName === undefined) test = truthy;
    else if (testName === 'equalto' || testName === 'eq') {
      if (operand === undefined) return () => unsupported('equalto without an operand');
      test = (x) => x === operand;
    } else if (hasOwn(TESTS, testName!)) test = TESTS[testName!]!;
    else return () => unsupported(`unknown test ${testName}`);
    const key = attr!;
    return (v) => {
      const items = listItems(v);
      if (items === null) return unsupported(`${select ? 'select' : 'reject'}attr of this type`);
      for (const item of items) if (!isPlain(item) && !(item instanceof Namespace)) unsupported('selectattr over items that are not mappings');
      return items.filter((item) => {
        const has = item instanceof Namespace ? item.vals.has(key) : hasOwn(item as Plain, key);
        const r = has ? test(item instanceof Namespace ? item.vals.get(key) : (item as Plain)[key]) : false;
        return select ? r : !r;
      });
    };
  }
}

// ---------------------------------------------------------------------------------------------

/** A template compiled to closures; `render` throws `Unsupported` where the interpreter must render. */
export class CompiledTemplate {
  /** @internal */
  constructor(
    private readonly body: Ex,
    private readonly rootKind: Kind,
    private readonly ctxNames: readonly string[],
  ) {}

  /**
   * Render with plain JSON-like context values (not the interpreter's runtime values, nor
   * `FrozenValue`s); `freezePlain` values are welcome and render faster.
   */
  render(context: Readonly<Record<string, unknown>>): string {
    // The interpreter refuses a context that redeclares a global.
    for (const name of GLOBAL_NAMES) if (hasOwn(context, name)) unsupported(`the context sets ${name}`);
    const names = this.ctxNames;
    const g = new Array<unknown>(names.length);
    for (let i = 0; i < names.length; i++) {
      const name = names[i]!;
      g[i] = hasOwn(context, name) ? context[name] : undefined;
    }
    return this.body(new Scope(this.rootKind, null, { ctx: context, g, ctl: 0 }));
  }
}

export type CompileResult = { template: CompiledTemplate; reason: null } | { template: null; reason: string };

/**
 * Compile a chat template (source text, or the `parsed` program of a @huggingface/jinja Template).
 * Answers with a reason instead when the template uses something not reproduced exactly here.
 */
export function compileTemplate(source: string | { body: unknown[] }): CompileResult {
  try {
    const program = (typeof source === 'string' ? new Template(source).parsed : source) as unknown as { body: N[] };
    const compiler = new Compiler();
    const body = compiler.compile(program);
    return { template: new CompiledTemplate(body, compiler.root, compiler.ctxNames), reason: null };
  } catch (err) {
    if (err instanceof Refusal) return { template: null, reason: err.message };
    throw err;
  }
}
