import { Environment, Interpreter } from '@huggingface/jinja';

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
