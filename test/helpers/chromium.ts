import { spawn, type ChildProcess } from 'node:child_process';
import { accessSync, constants, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import type { Readable, Writable } from 'node:stream';

/**
 * Headless Chromium driven over the DevTools protocol on `--remote-debugging-pipe`: Chromium reads
 * commands on fd 3 and writes replies and events on fd 4, each a JSON message ended by a NUL byte.
 * Enough of the protocol for a test to open pages and run script in them, without a browser
 * automation package (puppeteer-core's current release needs a newer Node than ours).
 */

const NAMES = ['chromium', 'chromium-browser', 'google-chrome', 'google-chrome-stable'];

/** The first Chromium on PATH, or null. */
export function findChromium(path = process.env.PATH ?? ''): string | null {
  for (const dir of path.split(delimiter).filter(Boolean)) {
    for (const name of NAMES) {
      const p = join(dir, name);
      try {
        accessSync(p, constants.X_OK);
        return p;
      } catch {
        // Not here.
      }
    }
  }
  return null;
}

interface Message {
  id?: number;
  method?: string;
  params?: Record<string, unknown>;
  result?: Record<string, unknown>;
  error?: { message: string };
  sessionId?: string;
}

export interface LaunchOptions {
  /** `--host-resolver-rules`, e.g. `MAP evil.example 127.0.0.1`: names the test makes resolve to loopback. */
  hostResolverRules?: string;
}

export class Chromium {
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (r: Record<string, unknown>) => void; reject: (e: Error) => void; method: string }>();
  private readonly listeners = new Set<(m: Message) => void>();
  private exited: string | null = null;
  private stderr = '';

  private constructor(private readonly child: ChildProcess, private readonly profile: string) {
    const out = child.stdio[4] as Readable;
    let buf = Buffer.alloc(0);
    out.on('data', (chunk: Buffer) => {
      buf = Buffer.concat([buf, chunk]);
      let end: number;
      while ((end = buf.indexOf(0)) >= 0) {
        const msg = JSON.parse(buf.subarray(0, end).toString('utf8')) as Message;
        buf = buf.subarray(end + 1);
        this.dispatch(msg);
      }
    });
    child.stderr?.on('data', (d: Buffer) => {
      // The last few KiB, for the message when the browser dies.
      this.stderr = (this.stderr + d.toString()).slice(-4096);
    });
    child.once('exit', (code, signal) => {
      this.exited = `chromium exited (${signal ?? code}): ${this.stderr.trim().split('\n').slice(-5).join(' | ')}`;
      for (const p of this.pending.values()) p.reject(new Error(`${p.method}: ${this.exited}`));
      this.pending.clear();
    });
  }

  static async launch(executable: string, opts: LaunchOptions = {}): Promise<Chromium> {
    const profile = mkdtempSync(join(tmpdir(), 'reef-chromium-'));
    const args = [
      '--headless=new', '--no-sandbox', '--disable-gpu', `--user-data-dir=${profile}`, '--remote-debugging-pipe',
      '--no-first-run', '--no-default-browser-check', '--disable-extensions', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', '--disable-dev-shm-usage',
      ...(opts.hostResolverRules ? [`--host-resolver-rules=${opts.hostResolverRules}`] : []),
      'about:blank',
    ];
    const child = spawn(executable, args, { stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'] });
    const browser = new Chromium(child, profile);
    await new Promise<void>((resolve, reject) => {
      child.once('spawn', resolve);
      child.once('error', reject);
    });
    // The first answer says the pipe is up.
    await browser.send('Browser.getVersion');
    return browser;
  }

  private dispatch(msg: Message): void {
    if (msg.id !== undefined) {
      const p = this.pending.get(msg.id);
      if (!p) return;
      this.pending.delete(msg.id);
      if (msg.error) p.reject(new Error(`${p.method}: ${msg.error.message}`));
      else p.resolve(msg.result ?? {});
      return;
    }
    for (const l of this.listeners) l(msg);
  }

  send(method: string, params: Record<string, unknown> = {}, sessionId?: string): Promise<Record<string, unknown>> {
    if (this.exited !== null) return Promise.reject(new Error(`${method}: ${this.exited}`));
    const id = this.nextId++;
    const msg = JSON.stringify({ id, method, params, ...(sessionId ? { sessionId } : {}) });
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject, method });
      (this.child.stdio[3] as Writable).write(`${msg}\0`);
    });
  }

  /** Resolves with the first event `method` of `sessionId` that `match` accepts. */
  waitFor(method: string, sessionId: string, match: (params: Record<string, unknown>) => boolean = () => true): Promise<Record<string, unknown>> {
    return new Promise((resolve) => {
      const l = (m: Message) => {
        if (m.method === method && m.sessionId === sessionId && match(m.params ?? {})) {
          this.listeners.delete(l);
          resolve(m.params ?? {});
        }
      };
      this.listeners.add(l);
    });
  }

  /** A new tab, attached in flat mode (its commands carry the session id). */
  async newPage(): Promise<Page> {
    const { targetId } = (await this.send('Target.createTarget', { url: 'about:blank' })) as { targetId: string };
    const { sessionId } = (await this.send('Target.attachToTarget', { targetId, flatten: true })) as { sessionId: string };
    await this.send('Page.enable', {}, sessionId);
    await this.send('Runtime.enable', {}, sessionId);
    return new Page(this, sessionId);
  }

  async close(): Promise<void> {
    if (this.exited === null) {
      const gone = new Promise<void>((r) => this.child.once('exit', () => r()));
      await this.send('Browser.close').catch(() => {});
      await gone;
    }
    rmSync(this.profile, { recursive: true, force: true });
  }
}

export class Page {
  constructor(private readonly browser: Chromium, readonly sessionId: string) {}

  /** Navigates and waits for the page's load event; returns the HTTP status of the document. */
  async navigate(url: string): Promise<number | null> {
    let status: number | null = null;
    const response = this.browser.waitFor('Network.responseReceived', this.sessionId, (p) => p.type === 'Document').then((p) => {
      status = (p.response as { status: number }).status;
    });
    await this.browser.send('Network.enable', {}, this.sessionId);
    const loaded = this.browser.waitFor('Page.loadEventFired', this.sessionId);
    const nav = (await this.browser.send('Page.navigate', { url }, this.sessionId)) as { errorText?: string };
    if (nav.errorText) throw new Error(`navigating to ${url}: ${nav.errorText}`);
    await loaded;
    await response;
    return status;
  }

  /** Runs `expression` in the page, awaiting a promise it returns; the value comes back as JSON. */
  async evaluate<T>(expression: string): Promise<T> {
    const r = (await this.browser.send('Runtime.evaluate', { expression, awaitPromise: true, returnByValue: true }, this.sessionId)) as {
      result: { value?: T };
      exceptionDetails?: { text: string; exception?: { description?: string } };
    };
    if (r.exceptionDetails) throw new Error(`in the page: ${r.exceptionDetails.exception?.description ?? r.exceptionDetails.text}`);
    return r.result.value as T;
  }

  /** The page's origin as the browser sees it. */
  origin(): Promise<string> {
    return this.evaluate<string>('location.origin');
  }

  /** Resolves once `expression` is truthy in the page (checked every 20 ms), with its value; rejects after `timeoutMs`. */
  waitUntil<T>(expression: string, what: string, timeoutMs = 10_000): Promise<T> {
    return this.evaluate<T>(`new Promise((resolve, reject) => {
      const deadline = Date.now() + ${timeoutMs};
      const check = () => {
        let v;
        try { v = (${expression}); } catch (e) { v = undefined; }
        if (v) return resolve(v);
        if (Date.now() > deadline) return reject(new Error(${JSON.stringify(`timed out waiting for ${what}`)}));
        setTimeout(check, 20);
      };
      check();
    })`);
  }

  /** The CSS viewport size (and the size a screenshot has). */
  async setViewport(width: number, height: number): Promise<void> {
    await this.browser.send('Emulation.setDeviceMetricsOverride', { width, height, deviceScaleFactor: 1, mobile: false }, this.sessionId);
  }

  /**
   * A real click, as a user's: the mouse pressed and released at the middle of the first element
   * `selector` matches (scrolled into view), so the browser runs its own hit test and event path.
   */
  async click(selector: string): Promise<void> {
    const box = await this.evaluate<{ x: number; y: number } | null>(`(() => {
      const e = document.querySelector(${JSON.stringify(selector)});
      if (!e) return null;
      e.scrollIntoView({ block: 'center' });
      const r = e.getBoundingClientRect();
      return { x: r.left + r.width / 2, y: r.top + r.height / 2 };
    })()`);
    if (box === null) throw new Error(`click: nothing matches ${selector}`);
    for (const type of ['mousePressed', 'mouseReleased']) {
      await this.browser.send('Input.dispatchMouseEvent', { type, x: box.x, y: box.y, button: 'left', clickCount: 1 }, this.sessionId);
    }
  }

  /** Types `text` into the focused element, as a keyboard would. */
  async type(text: string): Promise<void> {
    await this.browser.send('Input.insertText', { text }, this.sessionId);
  }

  /**
   * Answers the page's next `alert`/`confirm`/`prompt` (accepting or dismissing it) and resolves
   * with its message. Call before the action that opens it: a dialog blocks the page until answered.
   */
  nextDialog(accept: boolean): Promise<string> {
    return this.browser.waitFor('Page.javascriptDialogOpening', this.sessionId).then(async (p) => {
      await this.browser.send('Page.handleJavaScriptDialog', { accept }, this.sessionId);
      return String(p.message);
    });
  }

  /** A PNG of the viewport. */
  async screenshot(): Promise<Buffer> {
    const { data } = (await this.browser.send('Page.captureScreenshot', { format: 'png' }, this.sessionId)) as { data: string };
    return Buffer.from(data, 'base64');
  }
}
