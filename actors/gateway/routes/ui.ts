import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { FastifyInstance, FastifyReply } from 'fastify';
import { repoRoot } from '../../../cluster/paths.js';

/**
 * The live page (GET /reef/ui): one HTML file, one script, one style sheet, served as they are
 * written in `actors/gateway/ui/` (no build step). They hold nothing but code, so they load without
 * a key; every figure on the page comes from the key-scoped JSON routes, which the script calls with
 * the key the user typed.
 */

const ASSETS = {
  '/reef/ui': { file: 'index.html', type: 'text/html; charset=utf-8' },
  '/reef/ui/app.js': { file: 'app.js', type: 'text/javascript; charset=utf-8' },
  '/reef/ui/app.css': { file: 'app.css', type: 'text/css; charset=utf-8' },
} as const;

/** The routes that answer without a key (a keyless gateway's Host and Origin checks still apply). */
export const PUBLIC_UI_ROUTES: ReadonlySet<string> = new Set(Object.keys(ASSETS));

/**
 * Only the gateway's own files and requests: no inline script or style (an injected `<script>` or
 * `onerror=` in a hint would not run even if it ever became markup), no other origin to send data
 * to, no framing (clickjacking the rollback button), no `<base>` or form posts elsewhere.
 */
export const UI_CSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

export function registerUiRoutes(app: FastifyInstance, dir = join(repoRoot(), 'actors', 'gateway', 'ui')): void {
  const serve = (asset: { file: string; type: string }) => {
    // Read once: the files are part of the build, and a page polled by many tabs should not cost disk reads.
    const body = readFileSync(join(dir, asset.file));
    return async (_request: unknown, reply: FastifyReply) =>
      reply
        .type(asset.type)
        .header('content-security-policy', UI_CSP)
        .header('x-content-type-options', 'nosniff')
        .header('referrer-policy', 'no-referrer')
        .header('cache-control', 'no-cache')
        .send(body);
  };
  // Each route written out, so that the docs' route table test sees it.
  app.get('/reef/ui', serve(ASSETS['/reef/ui']));
  app.get('/reef/ui/app.js', serve(ASSETS['/reef/ui/app.js']));
  app.get('/reef/ui/app.css', serve(ASSETS['/reef/ui/app.css']));
}
