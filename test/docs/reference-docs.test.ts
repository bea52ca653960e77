/**
 * The reference docs name what the code has: the gateway's routes, the environment variables Reef
 * reads, the reef CLI's commands and flags, the bridge's messages. Each is read from the source, so a route, variable or
 * flag added without a line of docs fails here (config keys: cluster/config/docs.test.ts).
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { judgeMessages } from '../../actors/judge/messages.js';
import { BridgeRequest, REPLY_SCHEMAS } from '../../bridge/messages.js';
import { COMMAND_FLAGS } from '../../cluster/args.js';
import { main } from '../../cluster/cli.js';
import { repoRoot } from '../../cluster/paths.js';

const root = repoRoot();
const read = (rel: string) => readFileSync(join(root, rel), 'utf8');
const readme = read('README.md');
const internals = read('docs/internals.md');

/** Source files under `dir` (recursively), tests and build output left out. */
function sources(dir: string, exts: RegExp): string[] {
  return readdirSync(join(root, dir), { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile() && exts.test(e.name) && !/\.test\.|^test_|_test\.py$|conftest/.test(e.name))
    .map((e) => join(e.parentPath, e.name))
    .filter((p) => !/[/\\](tests?|node_modules|__pycache__|fixtures)[/\\]/.test(p.slice(root.length)));
}

/** `GET /reef/scenarios/{}/records`: a parameter's name does not matter, `:s` and `{s}` are alike. */
const route = (method: string, path: string) => `${method.toUpperCase()} ${path.replace(/\?.*$/, '').replace(/:\w+|\{\w+\}/g, '{}')}`;

describe('gateway routes', () => {
  const registered = ['actors/gateway/server.ts', ...readdirSync(join(root, 'actors/gateway/routes')).filter((f) => /^[^.]+\.ts$/.test(f)).map((f) => `actors/gateway/routes/${f}`)]
    // app.get('/x', …), scope.post<{ Params: … }>('/x', …)
    .flatMap((f) => [...read(f).matchAll(/\b(?:app|scope)\.(get|post|put|patch|delete)\s*(?:<[^(]*>)?\(\s*'(\/[^']*)'/g)])
    .map((m) => route(m[1]!, m[2]!))
    .sort();

  /** The route table of docs/internals.md: its first column holds `GET\|POST /path`, `GET /a`, `GET /b`. */
  const table = (() => {
    const lines = internals.split('\n');
    const start = lines.findIndex((l) => /^\|\s*route\s*\|/.test(l));
    const rows = lines.slice(start + 2).filter((_, i, all) => all.slice(0, i + 1).every((l) => l.startsWith('|')));
    return rows.flatMap((row) => {
      const first = row.split(/(?<!\\)\|/)[1]!;
      return [...first.matchAll(/`([A-Z\\|]+) ([^`]+)`/g)].flatMap((m) => m[1]!.split(/\\?\|/).map((method) => route(method, m[2]!)));
    });
  })();

  it('finds the routes it compares', () => {
    expect(registered).toContain('GET /healthz');
    expect(registered).toContain('POST /reef/scenarios/{}/releases/rollback');
    expect(table).toContain('POST /v1/chat/completions');
  });

  it('documents every route the gateway registers in docs/internals.md, and only those', () => {
    expect(registered.filter((r) => !table.includes(r))).toEqual([]);
    expect(table.filter((r) => !registered.includes(r))).toEqual([]);
  });

  it("names only the gateway's own routes elsewhere in the README and internals", () => {
    const named = [readme, internals, read('recipes/openclawrl/examples/openclawrl/README.md')]
      .flatMap((d) => [...d.matchAll(/`(GET|POST|PUT|PATCH|DELETE) (?:https?:\/\/[^/`]+)?(\/(?:v1|reef|metrics|healthz)\b[^`\s]*)`/g)])
      .map((m) => route(m[1]!, m[2]!));
    expect(named.length).toBeGreaterThan(0);
    expect(named.filter((r) => !registered.includes(r))).toEqual([]);
  });
});

describe('gateway metrics', () => {
  it('names every metric family the gateway exposes in docs/internals.md', () => {
    const families = ['actors/gateway/metrics.ts', 'actors/gateway/pipeline-status.ts']
      .flatMap((f) => [...read(f).matchAll(/(?:new (?:Counter|Gauge|Histogram)|family)\(\s*'(reef_\w+)'/g)].map((m) => m[1]!));
    expect(families).toContain('reef_http_requests_total');
    expect(families).toContain('reef_training');
    expect(families.filter((m) => !internals.includes(`\`${m}`))).toEqual([]);
  });
});

describe('environment variables', () => {
  const docs = [readme, ...readdirSync(join(root, 'docs')).filter((f) => f.endsWith('.md')).map((f) => read(`docs/${f}`)), read('recipes/openclawrl/examples/openclawrl/README.md')].join('\n');
  // Reef's own variables all start REEF_ (REEF_ERR_ is an error code, a name ending in _ a prefix).
  const read_ = [...new Set(['actors', 'bench', 'bin', 'bridge', 'cluster', 'python_shim', 'recipes', 'scripts']
    .flatMap((d) => sources(d, /\.(ts|mjs|js|py|sh)$/))
    .flatMap((f) => [...readFileSync(f, 'utf8').matchAll(/\bREEF_(?!ERR_)[A-Z0-9_]*[A-Z0-9]\b/g)].map((m) => m[0])))].sort();

  it('finds the variables it checks', () => {
    expect(read_).toContain('REEF_ENGINE_START_TIMEOUT_S');
    expect(read_).toContain('REEF_PYTHON');
  });

  it('documents every REEF_ variable the code reads', () => {
    expect(read_.filter((v) => !new RegExp(`\\b${v}\\b`).test(docs))).toEqual([]);
  });

  it('documents every variable a shell script reads with a default (${NAME:-…})', () => {
    const scripts = [...sources('scripts', /\.sh$/), ...sources('recipes', /\.sh$/)];
    /** Names the script sets itself (`NAME=…` other than `NAME="${NAME:-…}"`, `read -r A B`): not read from outside. */
    const setIn = (text: string) =>
      new Set([
        ...[...text.matchAll(/^\s*(?:export\s+|local\s+)?([A-Z_][A-Z0-9_]*)=(?!"?\$\{\1:)/gm)].map((m) => m[1]!),
        ...[...text.matchAll(/\bread\s+(?:-\w+\s+)*([A-Z_][A-Z0-9_ ]*)/g)].flatMap((m) => m[1]!.trim().split(/\s+/)),
      ]);
    const vars = [
      ...new Set(
        scripts.flatMap((f) => {
          const text = readFileSync(f, 'utf8');
          const own = setIn(text);
          return [...text.matchAll(/\$\{([A-Z_][A-Z0-9_]*):[-+]/g)].map((m) => m[1]!).filter((v) => !own.has(v));
        }),
      ),
    ].sort();
    expect(vars).toContain('NO_COLOR');
    expect(vars).toContain('STUDENT');
    expect(vars.filter((v) => !new RegExp(`\\b${v}\\b`).test(docs))).toEqual([]);
  });
});

describe('reef CLI in the README', () => {
  const section = readme.slice(readme.indexOf('## CLI'), readme.indexOf('\n## ', readme.indexOf('## CLI') + 1));
  /** The usage cell of a command's row: `reef up -c FILE [--detach] …`. */
  const usage = (cmd: string) => [...section.matchAll(/^\| `(reef [^`]+)` \|/gm)].map((m) => m[1]!).filter((u) => u.split(' ')[1] === cmd);
  const flagText = (flag: string) => (flag === 'config' ? /(^| |\[)-c FILE\b/ : new RegExp(`--${flag}\\b`));

  it('has a row for every command', () => {
    expect(Object.keys(COMMAND_FLAGS).filter((cmd) => usage(cmd).length === 0)).toEqual([]);
  });

  it("shows each command's flags in its row, and no flag it does not take", () => {
    const wrong: string[] = [];
    for (const [cmd, { flags }] of Object.entries(COMMAND_FLAGS)) {
      const text = usage(cmd).join(' ');
      if (text === '') continue;
      for (const f of flags) if (!flagText(f).test(text)) wrong.push(`reef ${cmd}: --${f} not shown`);
      for (const m of text.matchAll(/--([a-z][a-z-]*)\b(?!\.)/g)) if (!flags.includes(m[1]!)) wrong.push(`reef ${cmd}: shows --${m[1]}, which it does not take`);
    }
    expect(wrong).toEqual([]);
  });

  it("reef --help shows each command's flags too, and no flag it does not take", async () => {
    let help = '';
    expect(await main(['--help'], { stdout: (t) => (help += t), stderr: () => {} })).toBe(0);
    const wrong: string[] = [];
    for (const [cmd, { flags }] of Object.entries(COMMAND_FLAGS)) {
      // A command's usage runs from `reef <cmd>` to the next `reef ` (its description may wrap).
      const text = help.split(/(?=\breef )/).filter((u) => u.startsWith(`reef ${cmd} `)).join(' ');
      if (text === '') wrong.push(`reef ${cmd}: not in --help`);
      for (const f of flags) if (!flagText(f).test(text)) wrong.push(`reef ${cmd}: --${f} not shown`);
      for (const m of text.matchAll(/--([a-z][a-z-]*)\b(?!\.)/g)) if (!flags.includes(m[1]!)) wrong.push(`reef ${cmd}: shows --${m[1]}`);
    }
    expect(wrong).toEqual([]);
  });

  it('mentions --help and --version', () => {
    expect(section).toMatch(/--help/);
    expect(section).toMatch(/--version/);
  });
});

/**
 * The rows of the internals table whose header starts `| request \`type\``, after the line that
 * `after` matches, by type: [fields cell, reply cell].
 */
function messageTable(after: RegExp): Map<string, [string, string]> {
  const lines = internals.split('\n');
  const from = lines.findIndex((l) => after.test(l));
  const start = lines.findIndex((l, i) => i > from && /^\|\s*request `type`\s*\|\s*fields/.test(l));
  const out = new Map<string, [string, string]>();
  for (const line of lines.slice(start + 2)) {
    if (!line.startsWith('|')) break;
    const [, type, fields, reply] = line.split(/(?<!\\)\|/).map((c) => c.trim());
    const name = /^`([a-z-]+)`$/.exec(type ?? '')?.[1];
    if (name !== undefined) out.set(name, [fields ?? '', reply ?? '']);
  }
  return out;
}
const keysOf = (schema: unknown) => Object.keys((schema as { shape: Record<string, unknown> }).shape).filter((k) => k !== 'type' && k !== 'requestId');
const typeOf = (schema: { shape: { type: { value: string } } }) => schema.shape.type.value;

describe('bridge protocol table in docs/internals.md', () => {
  const rows = messageTable(/^## Bridge protocol/);
  const requests = BridgeRequest.options.map((o) => [typeOf(o), keysOf(o)] as const);

  it('has a row for every request type, and no other', () => {
    expect(requests.length).toBeGreaterThan(10);
    expect(requests.map(([t]) => t).filter((t) => !rows.has(t))).toEqual([]);
    expect([...rows.keys()].filter((t) => !requests.some(([r]) => r === t))).toEqual([]);
  });

  it("names each request's fields and each reply's fields in its row", () => {
    const wrong: string[] = [];
    for (const [type, fields] of requests) {
      const row = rows.get(type);
      if (row === undefined) continue;
      for (const f of fields) if (!row[0].includes(`\`${f}\``)) wrong.push(`${type}: request field ${f}`);
      for (const f of keysOf(REPLY_SCHEMAS[type])) if (!row[1].includes(`\`${f}\``)) wrong.push(`${type}: reply field ${f}`);
    }
    expect(wrong).toEqual([]);
  });
});

describe('judge mailbox table in docs/internals.md', () => {
  const rows = messageTable(/^## Judge and PRM actors/);
  const requests = judgeMessages.options.map((o) => [typeOf(o), keysOf(o)] as const);

  it("has a row for every request type, and no other, naming each of its fields", () => {
    expect(requests.length).toBeGreaterThan(3);
    expect(requests.map(([t]) => t).filter((t) => !rows.has(t))).toEqual([]);
    expect([...rows.keys()].filter((t) => !requests.some(([r]) => r === t))).toEqual([]);
    const wrong = requests.flatMap(([type, fields]) => fields.filter((f) => rows.has(type) && !rows.get(type)![0].includes(`\`${f}\``)).map((f) => `${type}: ${f}`));
    expect(wrong).toEqual([]);
  });
});
