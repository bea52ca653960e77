import { Environment, Interpreter } from '@huggingface/jinja';
import { jinjaTitle, pyCapitalize, pyCharAt, pyCompare, pyFloatRepr, pyIsLower, pyIsUpper, pyLen, pySplitWhitespace, pyStrip, pyStrRepr, pyTitle } from './py-str.js';
import { asciiOnly, freezePlain, pyMod } from './template-compiler.js';

/**
 * Python's jinja2 iterates an undefined value as an empty sequence; @huggingface/jinja throws.
 * Templates hit this whenever transformers has dropped a null key (an assistant message with
 * `content: null` and tool calls, looped over by a content-parts macro), so without this the same
 * request renders in Python and fails here. The throw happens after the iterable is evaluated and
 * before any output, so answering with the empty loop (its `else` block) is exactly jinja2's result.
 */
type ForNode = { defaultBlock: unknown[] };
type Evaluator = { evaluateFor(node: ForNode, env: Environment): unknown; evaluateBlock(stmts: unknown[], env: Environment): unknown };

const proto = Interpreter.prototype as unknown as Evaluator & { __reefUndefinedLoops?: boolean };
if (!proto.__reefUndefinedLoops) {
  const original = proto.evaluateFor;
  proto.evaluateFor = function evaluateFor(this: Evaluator, node: ForNode, env: Environment): unknown {
    try {
      return original.call(this, node, env);
    } catch (err) {
      if (err instanceof Error && err.message.endsWith('in for loop: got UndefinedValue')) {
        return this.evaluateBlock(node.defaultBlock ?? [], new Environment(env));
      }
      throw err;
    }
  };
  proto.__reefUndefinedLoops = true;
}

/**
 * jinja2 keeps what a loop iteration printed before `break` or `continue`, and runs a loop's else
 * block when no iteration ran to its end (not only when there were none), in the scope around the
 * loop. The interpreter dropped the iteration's output with the exception that ends it, and ran the
 * else block only for an empty loop, in the loop's scope. Here the loop body being run (`loops`)
 * returns its output so far instead of letting the exception through; a `break` then ends the loop
 * at the next iteration, and the else block is added when every iteration ended early.
 */
type Statement = { type: string };
type LoopNode = ForNode & { body: Statement[] };
type LoopEvaluator = {
  evaluate(node: unknown, env: Environment): { type: string; toString(): string };
  evaluateFor(node: LoopNode, env: Environment): Runtime<string>;
  evaluateBlock(stmts: Statement[], env: Environment): Runtime<string>;
};
const STATEMENTS = new Set(['Set', 'If', 'For', 'Macro', 'CallStatement', 'Break', 'Continue', 'FilterStatement', 'Comment', 'Program']);
interface LoopFrame { body: Statement[]; broken: boolean; ended: boolean; finished: boolean }

const loopProto = Interpreter.prototype as unknown as LoopEvaluator & { __reefLoopControls?: boolean };
if (!loopProto.__reefLoopControls) {
  const thrownBy = (type: string): new () => Error => {
    try {
      (new Interpreter() as unknown as LoopEvaluator).evaluate({ type }, new Environment());
    } catch (err) {
      return (err as Error).constructor as new () => Error;
    }
    throw new Error(`${type} did not throw`);
  };
  const BreakControl = thrownBy('Break');
  const ContinueControl = thrownBy('Continue');
  const loops: LoopFrame[] = [];
  /** Output of the enclosing blocks before a break/continue, for the loop body it leaves. */
  const partial = new WeakMap<Error, string>();
  const originalFor = loopProto.evaluateFor;
  loopProto.evaluateFor = function evaluateFor(this: LoopEvaluator, node: LoopNode, env: Environment): Runtime<string> {
    const frame: LoopFrame = { body: node.body, broken: false, ended: false, finished: false };
    loops.push(frame);
    let out: Runtime<string>;
    try {
      out = originalFor.call(this, node, env);
    } finally {
      loops.pop();
    }
    if (frame.ended && !frame.finished) return new StringValue(out.value + this.evaluateBlock(node.defaultBlock as Statement[], new Environment(env)).value) as Runtime<string>;
    return out;
  };
  loopProto.evaluateBlock = function evaluateBlock(this: LoopEvaluator, stmts: Statement[], env: Environment): Runtime<string> {
    const frame = loops.length > 0 ? loops[loops.length - 1]! : null;
    const loopBody = frame !== null && frame.body === stmts;
    if (loopBody && frame.broken) throw new BreakControl();
    let result = '';
    for (const st of stmts) {
      let value: { type: string; toString(): string };
      try {
        value = this.evaluate(st, env);
      } catch (err) {
        if (!(err instanceof BreakControl) && !(err instanceof ContinueControl)) throw err;
        // What an if or for printed before it reaches us; a set or filter block's output is dropped, as in jinja2.
        const inner = st.type === 'If' || st.type === 'For' ? (partial.get(err) ?? '') : '';
        if (!loopBody) {
          partial.set(err, result + inner);
          throw err;
        }
        frame.ended = true;
        if (err instanceof BreakControl) frame.broken = true;
        return new StringValue(result + inner) as Runtime<string>;
      }
      // A none value printed by {{ }} is "None" in jinja2; statements (set, macro, ...) answer none for no output.
      if (value.type === 'NullValue') result += STATEMENTS.has(st.type) ? '' : 'None';
      else if (value.type !== 'UndefinedValue') result += value.toString();
    }
    if (loopBody) frame.finished = true;
    return new StringValue(result) as Runtime<string>;
  };
  loopProto.__reefLoopControls = true;
}

/**
 * Template values converted once and reused across renders. @huggingface/jinja converts every
 * context value into its own runtime objects on each render, and a chat template then prints each
 * tool with `tojson`: for OpenClaw's dozen tool schemas that was about a third of a render. Agents
 * send the same tool list every turn, so the tokenizer converts it once (`frozenValue`) and the
 * renders pass the converted tree in.
 *
 * Sharing converted values across renders is safe because the interpreter never mutates an object
 * or a list (no `append`/`update` builtins; `set x.y` is refused on anything but a namespace). For
 * the same reason `tojson` of a frozen value always prints the same text, so it is kept per value
 * and per filter node (filter nodes belong to the parsed template, which lives as long as we do).
 */
export class FrozenValue {
  /**
   * `runtime`: the interpreter's tree; `plain`: the same value as a frozen plain copy, for the
   * compiled renderer (template-compiler.ts), which keeps `tojson` text of it the same way.
   */
  constructor(readonly runtime: unknown, readonly plain: unknown) {}
}

type FilterNode = { type: string; value?: unknown; callee?: { type: string; value?: unknown }; args?: Array<{ type: string; value?: unknown }> };
type FilterApplier = {
  applyFilter(operand: object, filter: FilterNode, env: Environment): unknown;
  evaluateArguments(args: unknown[], env: Environment): [Runtime[], Map<string, Runtime>];
};
type Settable = { set(name: string, value: unknown): unknown; declareVariable(name: string, value: unknown): unknown };

const frozen = new WeakSet<object>();
const tojsonMemo = new WeakMap<object, Map<FilterNode, unknown>>();

const LITERALS = new Set(['NumericLiteral', 'IntegerLiteral', 'FloatLiteral', 'StringLiteral', 'BooleanLiteral', 'NullLiteral']);
/** `tojson` or `tojson(<literal arguments>)`: a filter whose output depends on its operand alone. */
function isPureToJson(f: FilterNode): boolean {
  if (f.type === 'Identifier') return f.value === 'tojson';
  if (f.type !== 'CallExpression' || f.callee?.type !== 'Identifier' || f.callee.value !== 'tojson') return false;
  return (f.args ?? []).every((a) => LITERALS.has(a.type) || (a.type === 'KeywordArgumentExpression' && LITERALS.has((a.value as { type: string }).type)));
}

const envProto = Environment.prototype as unknown as Settable & { __reefFrozen?: boolean };
if (!envProto.__reefFrozen) {
  const originalSet = envProto.set;
  envProto.set = function set(this: Settable, name: string, value: unknown): unknown {
    return value instanceof FrozenValue ? this.declareVariable(name, value.runtime) : originalSet.call(this, name, value);
  };
  const interp = Interpreter.prototype as unknown as FilterApplier;
  const originalFilter = interp.applyFilter;
  interp.applyFilter = function applyFilter(this: FilterApplier, operand: object, filter: FilterNode, env: Environment): unknown {
    const name = filter.type === 'Identifier' ? filter.value : filter.type === 'CallExpression' && filter.callee?.type === 'Identifier' ? filter.callee.value : null;
    if (filter.type === 'Identifier' && filter.value === 'trim') {
      const type = (operand as Runtime).type;
      if (type === 'StringValue') return new StringValue(pyStrip((operand as Runtime<string>).value, null, true, true));
      // jinja2's undefined is the empty string to `trim` (Llama 3's `message['content'] | trim` without a content).
      if (type === 'UndefinedValue') return new StringValue('');
    }
    if (filter.type === 'Identifier' && filter.value === 'capitalize' && (operand as Runtime).type === 'StringValue') {
      return new StringValue(pyCapitalize((operand as Runtime<string>).value));
    }
    if (filter.type === 'Identifier' && filter.value === 'length' && (operand as Runtime).type === 'StringValue') {
      // Code points, as Python's len (the interpreter counted UTF-16 units).
      return sample(pyLen((operand as Runtime<string>).value));
    }
    if (filter.type === 'Identifier' && filter.value === 'title' && (operand as Runtime).type === 'StringValue') {
      return new StringValue(jinjaTitle((operand as Runtime<string>).value));
    }
    if (name === 'join' && ((operand as Runtime).type === 'ArrayValue' || (operand as Runtime).type === 'TupleValue')) {
      // Python's str() of each item (the interpreter joined the raw JS values: true, '' for none).
      const [args, kwargs] = filter.type === 'CallExpression' ? this.evaluateArguments(filter.args ?? [], env) : [[], new Map<string, Runtime>()];
      if (!kwargs.has('attribute')) {
        const sep = args[0] ?? kwargs.get('d') ?? kwargs.get('separator') ?? new StringValue('');
        if (sep.type !== 'StringValue') throw new Error('separator must be a string');
        const text = (operand as Runtime<Runtime[]>).value.map((x) => (x.type === 'StringValue' ? (x.value as string) : x.type === 'UndefinedValue' ? '' : x.type === 'NullValue' ? 'None' : String(x)));
        return new StringValue(text.join(sep.value as string));
      }
    }
    if (name === 'unique' && filter.type === 'Identifier' && (operand as Runtime).type === 'ArrayValue') {
      // jinja2's unique ignores case by default and compares 1, 1.0 and true as one value.
      const seen = new Set<string>();
      const out: Runtime[] = [];
      for (const x of (operand as Runtime<Runtime[]>).value) {
        let key: string;
        if (x.type === 'StringValue') key = 's' + (x.value as string).toLowerCase();
        else if (NUMERIC.has(x.type)) key = 'n' + Number(x.value);
        else if (x.type === 'NullValue') key = 'none';
        else throw new TypeError(`unhashable type in unique: ${x.type}`);
        if (seen.has(key)) continue;
        seen.add(key);
        out.push(x);
      }
      return new ArrayValue(out);
    }
    if (filter.type === 'Identifier' && filter.value === 'string') {
      const type = (operand as Runtime).type;
      if (type === 'BooleanValue' || type === 'FloatValue') return new StringValue(String(operand));
      if (type === 'NullValue') return new StringValue('None');
      if (type === 'ArrayValue' || type === 'TupleValue' || type === 'ObjectValue' || type === 'NamespaceValue') return new StringValue(runtimeRepr(operand as Runtime));
    }
    if ((operand as Runtime).type === 'UndefinedValue' && typeof name === 'string') {
      // jinja2 treats undefined as empty here (template-compiler.ts's OF_UNDEFINED); json.dumps refuses it.
      if (name === 'tojson') throw new TypeError('Object of type Undefined is not JSON serializable');
      const empty = OF_UNDEFINED.get(name);
      if (empty !== undefined) return empty();
    }
    if (name !== 'tojson') return originalFilter.call(this, operand, filter, env);
    if (!frozen.has(operand) || !isPureToJson(filter)) return tojsonFilter(this, operand as Runtime, filter, env);
    let memo = tojsonMemo.get(operand);
    if (!memo) tojsonMemo.set(operand, (memo = new Map()));
    let out = memo.get(filter);
    if (out === undefined) memo.set(filter, (out = tojsonFilter(this, operand as Runtime, filter, env)));
    return out;
  };
  envProto.__reefFrozen = true;
}

/** Converts a plain JSON value the way a render would, once, for reuse across renders. */
export function freezeValue(value: unknown): FrozenValue {
  const runtime = (new Environment() as unknown as Settable).set('value', value);
  const stack: unknown[] = [runtime];
  while (stack.length > 0) {
    const v = stack.pop() as { value?: unknown } | null;
    if (!v || typeof v !== 'object') continue;
    frozen.add(v);
    if (Array.isArray(v.value)) stack.push(...v.value);
    else if (v.value instanceof Map) stack.push(...v.value.values());
  }
  return new FrozenValue(runtime, freezePlain(value));
}

// ---------------------------------------------------------------------------------------------
// Python's str methods and json.dumps floats (py-str.ts)
//
// The interpreter uses JS's: `strip`, `lstrip` and `rstrip` ignored their argument and trimmed JS's
// whitespace, `split()` and `trim` split and trimmed at JS's whitespace, and `tojson` wrote floats
// as JS does (`1e-7` for Python's `1e-07`). The official Qwen3 template strips reasoning with
// `.strip('\n')`, so reasoning that began with a space lost it and the prompt's ids differed from
// transformers'. template-compiler.ts does the same, and must: the two are compared.

/** A value of the interpreter's runtime (its classes are not exported). */
interface Runtime<T = unknown> { type: string; value: T }
type RuntimeClass = new (value: unknown) => Runtime;
type StringRuntime = Runtime<string> & { builtins: Map<string, Runtime>; _builtins?: Map<string, Runtime> };

const sample = (value: unknown): Runtime => Environment.prototype.set.call(new Environment(), 'v', value) as Runtime;
const aString = sample('') as StringRuntime;
const StringValue = aString.constructor as RuntimeClass;
const ArrayValue = sample([]).constructor as RuntimeClass;
const FunctionValue = aString.builtins.get('strip')!.constructor as RuntimeClass;

/** `str.strip([chars])` and its kin take one optional string or None, positionally; else Python raises. */
function stripChars(name: string, args: readonly Runtime[]): string | null {
  if (args.length > 1 || args.some((a) => a.type === 'KeywordArgumentsValue')) throw new Error(`${name}() takes at most 1 positional argument`);
  const chars = args[0];
  if (chars === undefined || chars.type === 'NullValue') return null;
  if (chars.type !== 'StringValue') throw new Error(`${name} arg must be None or str`);
  return chars.value as string;
}

type Call = (args: Runtime[], env: Environment) => Runtime;

const stringProto = Object.getPrototypeOf(aString) as { __reefPyStrings?: boolean };
if (!stringProto.__reefPyStrings) {
  const builtins = Object.getOwnPropertyDescriptor(stringProto, 'builtins')!.get!;
  Object.defineProperty(stringProto, 'builtins', {
    configurable: true,
    get(this: StringRuntime): Map<string, Runtime> {
      const made = this._builtins !== undefined;
      const map = builtins.call(this) as Map<string, Runtime>;
      if (made) return map;
      const s = this.value;
      for (const [name, left, right] of [['strip', true, true], ['lstrip', true, false], ['rstrip', false, true]] as const) {
        map.set(name, new FunctionValue((args: Runtime[]) => new StringValue(pyStrip(s, stripChars(name, args), left, right))));
      }
      map.set('capitalize', new FunctionValue(() => new StringValue(pyCapitalize(s))));
      map.set('title', new FunctionValue(() => new StringValue(pyTitle(s))));
      const split = (map.get('split') as Runtime<Call>).value;
      map.set('split', new FunctionValue((args: Runtime[], env: Environment) => {
        // A separator (or a wrong argument) keeps the interpreter's split and its errors.
        if (args[0] !== undefined && args[0].type !== 'NullValue') return split(args, env);
        const maxsplit = args[1] ?? { type: 'IntegerValue', value: -1 };
        if (maxsplit.type !== 'IntegerValue') throw new Error('maxsplit argument must be a number');
        return new ArrayValue(pySplitWhitespace(s, maxsplit.value as number).map((part) => new StringValue(part)));
      }));
      return map;
    },
  });
  stringProto.__reefPyStrings = true;
}

interface ToJsonOptions { indent: number | null; ensureAscii: boolean; sortKeys: boolean; separators: [string, string] | null }

/** The interpreter's `toJSON`, line for line, except that a float is written as Python's json.dumps writes it. */
function toJson(input: Runtime, o: ToJsonOptions, depth: number): string {
  const { indent, ensureAscii, separators, sortKeys } = o;
  // indent=0 still breaks lines in json.dumps (the interpreter took 0 for none).
  const [itemSep, keySep] = separators ?? (indent !== null ? [',', ': '] : [', ', ': ']);
  switch (input.type) {
    case 'NullValue':
    case 'UndefinedValue': return 'null';
    case 'FloatValue': return pyFloatRepr(input.value as number);
    case 'IntegerValue':
    case 'BooleanValue': return JSON.stringify(input.value);
    case 'StringValue': {
      const text = JSON.stringify(input.value);
      return ensureAscii ? asciiOnly(text) : text;
    }
    case 'ArrayValue':
    case 'NamespaceValue':
    case 'ObjectValue': {
      const unit = indent !== null ? ' '.repeat(Math.max(0, indent)) : '';
      const base = '\n' + unit.repeat(depth);
      const child = base + unit;
      if (input.type === 'ArrayValue') {
        const core = (input.value as Runtime[]).map((x) => toJson(x, o, depth + 1));
        return indent !== null && core.length > 0 ? `[${child}${core.join(`${itemSep}${child}`)}${base}]` : `[${core.join(itemSep)}]`;
      }
      let entries = Array.from((input.value as Map<string, Runtime>).entries());
      if (sortKeys) entries = entries.sort(([a], [b]) => pyCompare(a, b));
      const core = entries.map(([key, value]) => {
        const keyText = ensureAscii ? asciiOnly(JSON.stringify(key)) : JSON.stringify(key);
        const item = `${keyText}${keySep}${toJson(value, o, depth + 1)}`;
        return indent !== null ? `${child}${item}` : item;
      });
      return indent !== null && core.length > 0 ? `{${core.join(itemSep)}${base}}` : `{${core.join(itemSep)}}`;
    }
  }
  throw new Error(`Cannot convert to JSON: ${input.type}`);
}

/** The interpreter's `tojson` filter, its argument checks included, writing with `toJson` above. */
function tojsonFilter(interp: FilterApplier, operand: Runtime, filter: FilterNode, env: Environment): Runtime {
  if (filter.type === 'Identifier') return new StringValue(toJson(operand, { indent: null, ensureAscii: false, sortKeys: false, separators: null }, 0));
  const [, kwargs] = interp.evaluateArguments(filter.args ?? [], env);
  const indent = kwargs.get('indent') ?? { type: 'NullValue', value: null };
  if (indent.type !== 'IntegerValue' && indent.type !== 'NullValue') throw new Error('If set, indent must be a number');
  const ensureAscii = kwargs.get('ensure_ascii') ?? { type: 'BooleanValue', value: false };
  if (ensureAscii.type !== 'BooleanValue') throw new Error('If set, ensure_ascii must be a boolean');
  const sortKeys = kwargs.get('sort_keys') ?? { type: 'BooleanValue', value: false };
  if (sortKeys.type !== 'BooleanValue') throw new Error('If set, sort_keys must be a boolean');
  const separatorsArg = kwargs.get('separators') ?? { type: 'NullValue', value: null };
  let separators: [string, string] | null = null;
  if (separatorsArg.type === 'ArrayValue' || separatorsArg.type === 'TupleValue') {
    const pair = separatorsArg.value as Runtime[];
    if (pair.length !== 2 || pair[0]!.type !== 'StringValue' || pair[1]!.type !== 'StringValue') throw new Error('separators must be a tuple of two strings');
    separators = [pair[0]!.value as string, pair[1]!.value as string];
  } else if (separatorsArg.type !== 'NullValue') throw new Error('If set, separators must be a tuple of two strings');
  const o = { indent: indent.value as number | null, ensureAscii: ensureAscii.value as boolean, sortKeys: sortKeys.value as boolean, separators };
  return new StringValue(toJson(operand, o, 0));
}

// ---------------------------------------------------------------------------------------------
// Python's `==`, `in`, `~` with an undefined operand, and str + str only (template-compiler.ts does the same)
//
// The interpreter compared lists and mappings by identity (`left.value == right.value`) and the
// rest with JS's loose `==` ('1' == 1, none == undefined), where jinja2 compares by value with
// Python's rules; `in` a list used identity too. `~` threw on an undefined operand, which jinja2
// prints as the empty string.

const BooleanValue = sample(true).constructor as RuntimeClass;
const NUMERIC = new Set(['BooleanValue', 'IntegerValue', 'FloatValue']);
const NUMBERS = new Set(['IntegerValue', 'FloatValue']);
const FloatValue = sample(1.5).constructor as RuntimeClass;

/** Python's `a == b` for two runtime values. */
function runtimeEquals(a: Runtime, b: Runtime): boolean {
  if (a === b) return true;
  switch (a.type) {
    case 'UndefinedValue':
    case 'NullValue': return b.type === a.type;
    case 'BooleanValue':
    case 'IntegerValue':
    case 'FloatValue': return NUMERIC.has(b.type) && Number(a.value) === Number(b.value);
    case 'StringValue': return b.type === 'StringValue' && a.value === b.value;
    case 'ArrayValue':
    case 'TupleValue': {
      // A tuple never equals a list in Python.
      if (b.type !== a.type) return false;
      const x = a.value as Runtime[];
      const y = b.value as Runtime[];
      return x.length === y.length && x.every((v, i) => runtimeEquals(v, y[i]!));
    }
    case 'ObjectValue': {
      if (b.type !== 'ObjectValue') return false;
      const x = a.value as Map<string, Runtime>;
      const y = b.value as Map<string, Runtime>;
      if (x.size !== y.size) return false;
      for (const [k, v] of x) {
        const w = y.get(k);
        if (w === undefined || !runtimeEquals(v, w)) return false;
      }
      return true;
    }
  }
  // Namespaces and macros equal only themselves.
  return a.value === b.value;
}

type BinaryNode = { operator: { value: string }; left: unknown; right: unknown };
/** Names no template can use (not identifiers in Jinja), bound to operands evaluated already. */
const OPERANDS = { left: { type: 'Identifier', value: '#left' }, right: { type: 'Identifier', value: '#right' } };
type BinaryEvaluator = {
  evaluate(node: unknown, env: Environment): Runtime;
  evaluateBinaryExpression(node: BinaryNode, env: Environment): Runtime;
};

const binaryProto = Interpreter.prototype as unknown as BinaryEvaluator & { __reefPyEquals?: boolean };
if (!binaryProto.__reefPyEquals) {
  const original = binaryProto.evaluateBinaryExpression;
  binaryProto.evaluateBinaryExpression = function evaluateBinaryExpression(this: BinaryEvaluator, node: BinaryNode, env: Environment): Runtime {
    const op = node.operator.value;
    if (op !== '==' && op !== '!=' && op !== 'in' && op !== 'not in' && op !== '~' && op !== '+' && op !== '%') return original.call(this, node, env);
    const left = this.evaluate(node.left, env);
    const right = this.evaluate(node.right, env);
    /** The interpreter's own operator on the values already evaluated. */
    const delegate = (): Runtime => {
      const scope = new Environment(env) as unknown as { setVariable(name: string, value: unknown): unknown };
      scope.setVariable(OPERANDS.left.value, left);
      scope.setVariable(OPERANDS.right.value, right);
      return original.call(this, { ...node, ...OPERANDS }, scope as unknown as Environment);
    };
    if (op === '%') {
      if (!NUMBERS.has(left.type) || !NUMBERS.has(right.type)) return delegate();
      // Python's sign rule (the interpreter's was JS's: -7 % 3 gave -1).
      const x = pyMod(left.value as number, right.value as number);
      return left.type === 'IntegerValue' && right.type === 'IntegerValue' ? sample(x) : new FloatValue(x);
    }
    if (op === '+') {
      const ls = left.type === 'StringValue';
      const rs = right.type === 'StringValue';
      if (ls && rs) return new StringValue((left.value as string) + (right.value as string));
      // Python refuses str + anything else; the interpreter wrote "[object Map]" for a mapping
      // (DeepSeek's `'...' + tool['function']['arguments']` with arguments sent as an object).
      if (ls || rs) {
        const other = ls ? right : left;
        if (other.type !== 'UndefinedValue' && other.type !== 'NullValue') throw new TypeError(`can only concatenate str (not ${other.type}) to str`);
      }
      return delegate();
    }
    if (op === '==' || op === '!=') return new BooleanValue(runtimeEquals(left, right) === (op === '=='));
    if (op === '~') {
      const text = (v: Runtime): string => (v.type === 'UndefinedValue' ? '' : v.type === 'NullValue' ? 'None' : v.type === 'BooleanValue' || v.type === 'FloatValue' ? v.toString() : String((v.value as { toString(): string }).toString()));
      return new StringValue(text(left) + text(right));
    }
    // `in` and `not in`: the interpreter's checks and errors, with Python's equality for list items.
    const positive = op === 'in';
    if (right.type === 'UndefinedValue') return new BooleanValue(!positive);
    if (left.type === 'UndefinedValue') throw new Error(`Cannot perform operation ${op} on undefined values`);
    if (left.type === 'NullValue' || right.type === 'NullValue') throw new Error('Cannot perform operation on null values');
    if (right.type === 'ArrayValue' || right.type === 'TupleValue') return new BooleanValue((right.value as Runtime[]).some((x) => runtimeEquals(left, x)) === positive);
    if (left.type === 'StringValue' && right.type === 'StringValue') return new BooleanValue((right.value as string).includes(left.value as string) === positive);
    if (left.type === 'StringValue' && right.type === 'ObjectValue') return new BooleanValue((right.value as Map<string, Runtime>).has(left.value as string) === positive);
    throw new SyntaxError(`Unknown operator "${op}" between ${left.type} and ${right.type}`);
  };
  binaryProto.__reefPyEquals = true;
}

// Python's str() of booleans and floats wherever the interpreter prints or converts them with
// toString ({{ }}, the string filter): "True"/"False" and repr's float form, as jinja2 writes them
// (template-compiler.ts's pyScalar).
const scalarProto = Object.getPrototypeOf(sample(true)) as { toString(): string; __reefPyStr?: boolean };
if (!scalarProto.__reefPyStr) {
  scalarProto.toString = function toString(this: Runtime<boolean>): string {
    return this.value ? 'True' : 'False';
  };
  (Object.getPrototypeOf(sample(1.5)) as { toString(): string }).toString = function toString(this: Runtime<number>): string {
    return pyFloatRepr(this.value);
  };
  scalarProto.__reefPyStr = true;
}

// ---------------------------------------------------------------------------------------------
// `o[k]` with a key Python's lookup fails on: undefined, as in jinja2 (template-compiler.ts's
// getItem). The interpreter threw for any key but a string (and an integer on a list or string).

type MemberNode = { type: string; object: unknown; property: { type: string }; computed: boolean };
type MemberEvaluator = {
  evaluate(node: unknown, env: Environment): Runtime;
  evaluateMemberExpression(node: MemberNode, env: Environment): Runtime;
};
const UndefinedValue = sample(undefined).constructor as RuntimeClass;
const memberProto = Interpreter.prototype as unknown as MemberEvaluator & { __reefPyItems?: boolean };
if (!memberProto.__reefPyItems) {
  const original = memberProto.evaluateMemberExpression;
  memberProto.evaluateMemberExpression = function evaluateMemberExpression(this: MemberEvaluator, node: MemberNode, env: Environment): Runtime {
    if (!node.computed || node.property.type === 'SliceExpression') return original.call(this, node, env);
    const object = this.evaluate(node.object, env);
    let key = this.evaluate(node.property, env);
    if (key.type === 'BooleanValue') key = sample(key.value ? 1 : 0);
    const sequence = object.type === 'ArrayValue' || object.type === 'TupleValue' || object.type === 'StringValue';
    if (key.type !== 'StringValue' && object.type !== 'UndefinedValue' && !(sequence && key.type === 'IntegerValue')) return new UndefinedValue(undefined);
    if (object.type === 'StringValue' && key.type === 'IntegerValue') {
      const ch = pyCharAt(object.value as string, key.value as number);
      return ch === undefined ? new UndefinedValue(undefined) : new StringValue(ch);
    }
    const scope = new Environment(env) as unknown as { setVariable(name: string, value: unknown): unknown };
    scope.setVariable(OPERANDS.left.value, object);
    scope.setVariable(OPERANDS.right.value, key);
    return original.call(this, { ...node, object: OPERANDS.left, property: OPERANDS.right }, scope as unknown as Environment);
  };
  memberProto.__reefPyItems = true;
}

// `is iterable`, `is sequence`, `is number` and `is callable` as jinja2 answers them
// (template-compiler.ts's TESTS).
const tests = (Environment as unknown as { TESTS: Map<string, (operand: Runtime) => boolean> & { __reefPyTests?: boolean } }).TESTS;
if (!tests.__reefPyTests) {
  const ITERABLE = new Set(['ArrayValue', 'TupleValue', 'StringValue', 'ObjectValue', 'KeywordArgumentsValue', 'UndefinedValue']);
  tests.set('iterable', (operand) => ITERABLE.has(operand.type));
  tests.set('sequence', (operand) => ITERABLE.has(operand.type));
  // A bool is a Number in Python; undefined is callable (its __call__ raises).
  tests.set('number', (operand) => NUMERIC.has(operand.type));
  tests.set('lower', (operand) => operand.type === 'StringValue' && pyIsLower(operand.value as string));
  tests.set('upper', (operand) => operand.type === 'StringValue' && pyIsUpper(operand.value as string));
  const callable = tests.get('callable')!;
  tests.set('callable', (operand) => operand.type === 'UndefinedValue' || callable(operand));
  tests.__reefPyTests = true;
}

const OF_UNDEFINED = new Map<string, () => Runtime>([
  ...['length'].map((n) => [n, () => sample(0)] as const),
  ...['join', 'string', 'lower', 'upper', 'capitalize', 'title'].map((n) => [n, () => new StringValue('')] as const),
  ...['list', 'map', 'selectattr', 'rejectattr', 'items', 'reverse', 'sort'].map((n) => [n, () => new ArrayValue([])] as const),
  ...['first', 'last'].map((n) => [n, () => sample(undefined)] as const),
]);

/** Python's repr of a runtime value: lists and mappings print so in jinja2 (template-compiler.ts's pyRepr). */
function runtimeRepr(v: Runtime): string {
  switch (v.type) {
    case 'StringValue': return pyStrRepr(v.value as string);
    case 'IntegerValue': return String(v.value);
    case 'FloatValue': return pyFloatRepr(v.value as number);
    case 'BooleanValue': return v.value ? 'True' : 'False';
    case 'NullValue': return 'None';
    case 'UndefinedValue': return 'Undefined';
    case 'ArrayValue': return '[' + (v.value as Runtime[]).map(runtimeRepr).join(', ') + ']';
    case 'TupleValue': {
      const items = (v.value as Runtime[]).map(runtimeRepr);
      return items.length === 1 ? `(${items[0]},)` : '(' + items.join(', ') + ')';
    }
    case 'ObjectValue':
    case 'NamespaceValue': {
      const dict = '{' + Array.from((v.value as Map<string, Runtime>), ([k, x]) => pyStrRepr(k) + ': ' + runtimeRepr(x)).join(', ') + '}';
      return v.type === 'NamespaceValue' ? `<Namespace ${dict}>` : dict;
    }
  }
  return String(v);
}

// {{ }} of a list, mapping or namespace prints its repr (toString).
const aNamespace = (new Environment() as unknown as { variables: Map<string, Runtime<(args: unknown[]) => Runtime>> }).variables.get('namespace')!.value([]);
for (const value of [sample([]), sample({}), aNamespace]) {
  const proto = Object.getPrototypeOf(value) as { toString(): string; __reefRepr?: boolean };
  if (!proto.__reefRepr) {
    proto.toString = function toString(this: Runtime): string {
      return runtimeRepr(this);
    };
    proto.__reefRepr = true;
  }
}

// ---------------------------------------------------------------------------------------------
// jinja2's numeric filters the interpreter lacks (it threw "Unknown filter"): `round`, `sum`,
// `max`, `min`. template-compiler.ts does not compile them (an unknown filter there throws
// Unsupported when it runs), so these renders are the interpreter's. Where an argument or a value
// is outside what is reproduced exactly here, the filter throws: the request fails rather than
// rendering text Python would not.

/** The filter's arguments by jinja2's parameter names (positional, then keyword); Python's TypeError for the rest. */
function filterArguments(interp: FilterApplier, filter: FilterNode, env: Environment, params: readonly string[]): (Runtime | undefined)[] {
  const out: (Runtime | undefined)[] = params.map(() => undefined);
  if (filter.type !== 'CallExpression') return out;
  const [args, kwargs] = interp.evaluateArguments(filter.args ?? [], env);
  if (args.length > params.length) throw new TypeError(`${String(filter.callee?.value)}() takes at most ${params.length} arguments`);
  args.forEach((a, i) => (out[i] = a));
  for (const [key, value] of kwargs) {
    const i = params.indexOf(key);
    if (i < 0 || out[i] !== undefined) throw new TypeError(`${String(filter.callee?.value)}() got an unexpected or repeated argument '${key}'`);
    out[i] = value;
  }
  return out;
}

/** A finite double as m * 2^e exactly (m a non-negative integer). */
function decompose(x: number): [bigint, bigint] {
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, Math.abs(x));
  const bits = view.getBigUint64(0);
  const exp = Number((bits >> 52n) & 0x7ffn);
  const frac = bits & ((1n << 52n) - 1n);
  return exp === 0 ? [frac, -1074n] : [frac | (1n << 52n), BigInt(exp - 1075)];
}

/** `q` rounded half to even from num/den (both non-negative, den > 0). */
function roundHalfEven(num: bigint, den: bigint): bigint {
  const q = num / den;
  const twice = 2n * (num - q * den);
  return twice > den || (twice === den && (q & 1n) === 1n) ? q + 1n : q;
}

/**
 * Python's round(x, p) of a float: the exact binary value rounded half to even at p decimals, read
 * back as the nearest float (CPython's double_round), with its shortcuts for very large and small p.
 */
function pyRoundFloat(x: number, p: number): number {
  if (!Number.isFinite(x) || x === 0 || p > 323) return x;
  if (p < -308) return 0 * x;
  const [m, e] = decompose(x);
  let num = e >= 0n ? m << e : m;
  let den = e >= 0n ? 1n : 1n << -e;
  if (p >= 0) num *= 10n ** BigInt(p);
  else den *= 10n ** BigInt(-p);
  const rounded = Number(`${x < 0 ? '-' : ''}${roundHalfEven(num, den)}e${-p}`);
  if (!Number.isFinite(rounded)) throw new RangeError('rounded value too large to represent');
  return rounded;
}

/** Python's round(n, p) of an int: n itself for p >= 0, else the nearest multiple of 10^-p, ties to even. */
function pyRoundInt(n: number, p: number): number {
  if (p >= 0) return n;
  const unit = 10n ** BigInt(-p);
  const big = BigInt(n);
  const magnitude = roundHalfEven(big < 0n ? -big : big, unit) * unit;
  const out = Number(big < 0n ? -magnitude : magnitude);
  if (!Number.isSafeInteger(out)) throw new RangeError('round: integer result beyond what is exact here');
  return out;
}

/** jinja2's `round(value, precision=0, method='common')`. */
function roundFilter(operand: Runtime, precisionArg: Runtime | undefined, methodArg: Runtime | undefined): Runtime {
  const method = methodArg === undefined ? 'common' : methodArg.type === 'StringValue' ? (methodArg.value as string) : null;
  if (method !== 'common' && method !== 'ceil' && method !== 'floor') throw new Error('method must be common, ceil or floor');
  // An int precision (a bool is one); Python's ceil and floor would take a float too, not reproduced here.
  if (precisionArg !== undefined && precisionArg.type !== 'IntegerValue' && precisionArg.type !== 'BooleanValue') throw new TypeError('round: precision must be an integer');
  const p = precisionArg === undefined ? 0 : Number(precisionArg.value);
  if (!NUMERIC.has(operand.type)) throw new TypeError(`type ${operand.type} doesn't define __round__ method`);
  const x = Number(operand.value);
  const float = operand.type === 'FloatValue';
  if (method === 'common') return float ? new FloatValue(pyRoundFloat(x, p)) : sample(pyRoundInt(x, p));
  // math.ceil / math.floor of value * 10**precision, then divided by 10**precision.
  const step = method === 'ceil' ? Math.ceil : Math.floor;
  if (p >= 0) {
    if (!float) return new FloatValue(x);
    if (p > 308) throw new RangeError('int too large to convert to float');
    const scaled = x * Number(`1e${p}`);
    if (!Number.isFinite(scaled)) throw new RangeError(`cannot convert float ${scaled} to integer`);
    // An int over an int: the exact quotient, rounded once.
    return new FloatValue(Number(`${BigInt(step(scaled))}e-${p}`));
  }
  const factor = Number(`1e${p}`);
  const scaled = x * factor;
  if (!Number.isFinite(scaled)) throw new RangeError(`cannot convert float ${scaled} to integer`);
  // An int over a float; the int is 0, never -0.
  return new FloatValue((step(scaled) + 0) / factor);
}

/**
 * jinja2's `make_attrgetter` parts: the attribute split at dots, a part of ASCII digits an int
 * index. A part with other characters Python's isdigit takes (int() of them may fail) raises here.
 */
function attributeParts(attribute: Runtime | undefined): (string | number)[] {
  if (attribute === undefined || attribute.type === 'NullValue') return [];
  if (attribute.type === 'IntegerValue') return [attribute.value as number];
  if (attribute.type !== 'StringValue') throw new TypeError('attribute must be a string or an int');
  return (attribute.value as string).split('.').map((part) => {
    if (/^[0-9]+$/.test(part)) return Number(part);
    if (/[^\x00-\x7f]/.test(part)) throw new Error('attribute parts beyond ASCII are not reproduced');
    return part;
  });
}

/**
 * jinja2's `environment.getitem` along the parts: a mapping's key, a list's index. A lookup that
 * misses with an int (a mapping's key '0', an index past the end) is undefined, as in jinja2; one
 * that misses with a name raises here, since Python would go on to the object's attributes.
 */
function lookupAttribute(item: Runtime, parts: readonly (string | number)[]): Runtime {
  let v = item;
  for (const part of parts) {
    if (typeof part === 'number') {
      const items = v.type === 'ArrayValue' || v.type === 'TupleValue' ? (v.value as Runtime[]) : null;
      if (items === null && v.type !== 'ObjectValue') throw new TypeError(`lookup of ${part} in ${v.type} is not reproduced`);
      v = items !== null && part < items.length ? items[part]! : new UndefinedValue(undefined);
      continue;
    }
    const found = v.type === 'ObjectValue' ? (v.value as Map<string, Runtime>).get(part) : undefined;
    if (found === undefined) throw new TypeError(`no key '${part}' in ${v.type}`);
    v = found;
  }
  return v;
}

/** What Python's iter() gives for the operand of sum, max or min: a mapping's keys, a string's code points, nothing for undefined. */
function iterated(operand: Runtime, filter: string): Runtime[] {
  switch (operand.type) {
    case 'ArrayValue':
    case 'TupleValue': return operand.value as Runtime[];
    case 'UndefinedValue': return [];
    case 'ObjectValue': return Array.from((operand.value as Map<string, Runtime>).keys(), (k) => new StringValue(k));
    case 'StringValue': return Array.from(operand.value as string, (c) => new StringValue(c));
  }
  throw new TypeError(`'${operand.type}' object is not iterable (${filter})`);
}

/** jinja2's `sum(iterable, attribute=None, start=0)`: Python's sum of numbers, left to right. */
function sumFilter(operand: Runtime, attribute: Runtime | undefined, start: Runtime | undefined): Runtime {
  const parts = attributeParts(attribute);
  const first = start ?? sample(0);
  if (!NUMERIC.has(first.type)) throw new TypeError(`sum of a ${first.type} start is not reproduced`);
  const items = iterated(operand, 'sum').map((item) => lookupAttribute(item, parts));
  if (items.length === 0) return first;
  let float = first.type === 'FloatValue';
  let total = Number(first.value);
  for (const item of items) {
    if (!NUMERIC.has(item.type)) throw new TypeError(`unsupported operand type(s) for +: ${float ? 'float' : 'int'} and ${item.type}`);
    float ||= item.type === 'FloatValue';
    total += Number(item.value);
    // Python's ints are exact at any size; past 2^53 JS's are not.
    if (!float && !Number.isSafeInteger(total)) throw new RangeError('sum: integer beyond what is exact here');
  }
  return float ? new FloatValue(total) : sample(total);
}

/** Python's `a > b` for the values max and min compare: numbers (booleans among them) or strings; else raises. */
function pyGreater(a: Runtime, b: Runtime): boolean {
  if (NUMERIC.has(a.type) && NUMERIC.has(b.type)) return Number(a.value) > Number(b.value);
  if (a.type === 'StringValue' && b.type === 'StringValue') return pyCompare(a.value as string, b.value as string) > 0;
  throw new TypeError(`comparison of ${a.type} and ${b.type} is not reproduced`);
}

/**
 * jinja2's `max`/`min(value, case_sensitive=False, attribute=None)`: Python's max/min with a key
 * (the attribute, strings lowered unless case_sensitive), the first of equal items; undefined for
 * an empty sequence.
 */
function extremeFilter(operand: Runtime, largest: boolean, caseSensitive: Runtime | undefined, attribute: Runtime | undefined): Runtime {
  if (caseSensitive !== undefined && caseSensitive.type !== 'BooleanValue') throw new TypeError('case_sensitive other than a boolean is not reproduced');
  const lower = caseSensitive === undefined || caseSensitive.value === false;
  const parts = attributeParts(attribute);
  const items = iterated(operand, largest ? 'max' : 'min');
  if (items.length === 0) return new UndefinedValue(undefined);
  const keyOf = (item: Runtime): Runtime => {
    const k = lookupAttribute(item, parts);
    return lower && k.type === 'StringValue' ? new StringValue((k.value as string).toLowerCase()) : k;
  };
  let best = items[0]!;
  let bestKey = keyOf(best);
  for (const item of items.slice(1)) {
    const key = keyOf(item);
    if (largest ? pyGreater(key, bestKey) : pyGreater(bestKey, key)) {
      best = item;
      bestKey = key;
    }
  }
  return best;
}

const numericProto = Interpreter.prototype as unknown as FilterApplier & { __reefPyNumericFilters?: boolean };
if (!numericProto.__reefPyNumericFilters) {
  const original = numericProto.applyFilter;
  numericProto.applyFilter = function applyFilter(this: FilterApplier, operand: object, filter: FilterNode, env: Environment): unknown {
    const name = filter.type === 'Identifier' ? filter.value : filter.type === 'CallExpression' && filter.callee?.type === 'Identifier' ? filter.callee.value : null;
    if (name === 'round') {
      const [precision, method] = filterArguments(this, filter, env, ['precision', 'method']);
      return roundFilter(operand as Runtime, precision, method);
    }
    if (name === 'sum') {
      const [attribute, start] = filterArguments(this, filter, env, ['attribute', 'start']);
      return sumFilter(operand as Runtime, attribute, start);
    }
    if (name === 'max' || name === 'min') {
      const [caseSensitive, attribute] = filterArguments(this, filter, env, ['case_sensitive', 'attribute']);
      return extremeFilter(operand as Runtime, name === 'max', caseSensitive, attribute);
    }
    return original.call(this, operand, filter, env);
  };
  numericProto.__reefPyNumericFilters = true;
}

// ---------------------------------------------------------------------------------------------
// `loop.cycle(a, b, ...)`: jinja2's loop helper, the argument at loop.index0 modulo their number
// (the interpreter's loop had no cycle, and calling the undefined failed). The loop object stays
// the interpreter's nine-entry mapping (its length and printing unchanged, as template-compiler.ts
// reproduces them); `cycle` is answered on attribute or subscript access to it. The compiled
// renderer throws Unsupported for loop.cycle, so these renders are the interpreter's.

const LOOP_KEYS = ['index', 'index0', 'revindex', 'revindex0', 'first', 'last', 'length', 'previtem', 'nextitem'];
const loopObjects = new WeakSet<object>();
type VariableSetter = { setVariable(name: string, value: unknown): unknown };
const variableProto = Environment.prototype as unknown as VariableSetter & { __reefLoopCycle?: boolean };
if (!variableProto.__reefLoopCycle) {
  const originalSetVariable = variableProto.setVariable;
  variableProto.setVariable = function setVariable(this: VariableSetter, name: string, value: unknown): unknown {
    if (name === 'loop' && (value as Runtime | null)?.type === 'ObjectValue') {
      const keys = Array.from(((value as Runtime).value as Map<string, Runtime>).keys());
      if (keys.length === LOOP_KEYS.length && keys.every((k, i) => k === LOOP_KEYS[i])) loopObjects.add(value as object);
    }
    return originalSetVariable.call(this, name, value);
  };
  const cycleOf = (loop: Runtime): Runtime => {
    const index0 = ((loop.value as Map<string, Runtime>).get('index0')!.value as number);
    return new FunctionValue((args: Runtime[]) => {
      if (args.some((a) => a.type === 'KeywordArgumentsValue')) throw new TypeError("cycle() got an unexpected keyword argument");
      if (args.length === 0) throw new TypeError('no items for cycling given');
      return args[index0 % args.length]!;
    });
  };
  const original = memberProto.evaluateMemberExpression;
  memberProto.evaluateMemberExpression = function evaluateMemberExpression(this: MemberEvaluator, node: MemberNode, env: Environment): Runtime {
    // `x.cycle` or `x['cycle']` (a literal key: other lookups go straight through, at no cost).
    const property = node.property as { type: string; value?: unknown };
    if (property.value !== 'cycle' || property.type !== (node.computed ? 'StringLiteral' : 'Identifier')) return original.call(this, node, env);
    const object = this.evaluate(node.object, env);
    if (loopObjects.has(object)) return cycleOf(object);
    // Anything else: the lookup as before, on the object evaluated already.
    const scope = new Environment(env) as unknown as VariableSetter;
    scope.setVariable(OPERANDS.left.value, object);
    return original.call(this, { ...node, object: OPERANDS.left }, scope as unknown as Environment);
  };
  variableProto.__reefLoopCycle = true;
}
