#!/usr/bin/env node
/**
 * `node dist/recipes/openclawrl/harness/header-shim-main.js --upstream URL [options]`: the header
 * shim as a process. Prints one JSON line `{"event":"ready","url":...}` when it listens; SIGINT or
 * SIGTERM stops it after the requests in flight.
 */
import { parseArgs } from 'node:util';
import { ReefError } from '../../../actors/runtime/errors.js';
import { parseSessionRule, startHeaderShim } from './header-shim.js';

const USAGE = `usage: header-shim-main --upstream URL [--host H] [--port P] [--scenario NAME]
       [--session none|path|per-connection[:PREFIX]|fixed:VALUE] [--api-key-env NAME] [--replace-authorization]
       [--allow-host NAME ...] [--allow-origin ORIGIN ...]

  --upstream               the Reef gateway, e.g. http://127.0.0.1:8600
  --port                   where the shim listens (default 8700; 0 picks a free port)
  --scenario               x-reef-scenario to add (default: none, the gateway's default applies)
  --session                how x-reef-tag-session is chosen (default none):
                             fixed:VALUE      one value, changed with PUT /_reef_shim/session
                             per-connection   PREFIX-cN for each TCP connection
                             path             base URL http://shim/t/<tag>/v1 carries the tag
  --api-key-env            environment variable with the gateway key, sent as Authorization: Bearer
  --replace-authorization  also replace an Authorization header the agent sends itself
  --allow-host             a name clients may send in Host besides localhost, loopback and --host (repeatable)
  --allow-origin           a browser origin allowed besides the shim's own, e.g. http://localhost:3000 (repeatable)

Only /v1/* is forwarded. Browsers on another origin, and Host names other than the above, are refused.`;

async function main(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: {
      upstream: { type: 'string' },
      host: { type: 'string', default: '127.0.0.1' },
      port: { type: 'string', default: '8700' },
      scenario: { type: 'string' },
      session: { type: 'string', default: 'none' },
      'api-key-env': { type: 'string' },
      'replace-authorization': { type: 'boolean', default: false },
      'allow-host': { type: 'string', multiple: true, default: [] },
      'allow-origin': { type: 'string', multiple: true, default: [] },
      help: { type: 'boolean', default: false },
    },
  });
  if (values.help || !values.upstream) {
    process.stderr.write(`${USAGE}\n`);
    return values.help ? 0 : 2;
  }
  const envName = values['api-key-env'];
  const apiKey = envName ? process.env[envName] : undefined;
  if (envName && !apiKey) throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `--api-key-env: environment variable ${envName} is not set` });
  const port = Number(values.port);
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `--port: expected 0-65535, got ${values.port}` });
  const shim = await startHeaderShim({
    upstream: values.upstream,
    host: values.host,
    port,
    scenario: values.scenario ?? null,
    session: parseSessionRule(values.session),
    apiKey: apiKey ?? null,
    replaceAuthorization: values['replace-authorization'],
    allowedHosts: values['allow-host'],
    allowedOrigins: values['allow-origin'],
  });
  process.stdout.write(`${JSON.stringify({ event: 'ready', url: shim.url, upstream: values.upstream, pid: process.pid })}\n`);
  await new Promise<void>((resolve) => {
    process.once('SIGINT', resolve);
    process.once('SIGTERM', resolve);
  });
  await shim.close();
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => {
    process.stderr.write(`header-shim: ${err instanceof ReefError ? `${err.code}: ` : ''}${(err as Error).message}\n`);
    // A usage error, ours or parseArgs' (an unknown option, a missing value), exits 2 as the other CLIs do.
    const usage = (err instanceof ReefError && err.code === 'REEF_ERR_INVALID_ARGUMENT') || String((err as { code?: unknown }).code ?? '').startsWith('ERR_PARSE_ARGS_');
    if (usage && !(err instanceof ReefError)) process.stderr.write('header-shim: see --help\n');
    process.exit(usage ? 2 : 1);
  },
);
