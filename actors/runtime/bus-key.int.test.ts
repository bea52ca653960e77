import { mkdtempSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import * as zmq from 'zeromq';
import { z } from 'zod';
import { keylessSend } from '../../test/helpers/keyless.js';
import { makeBusKeyFile, readBusKeyFile } from './bus-key.js';
import { Mailbox } from './mailbox.js';
import { RpcClient } from './rpc.js';

const messages = z.discriminatedUnion('type', [z.object({ type: z.literal('add'), requestId: z.string(), a: z.number(), b: z.number() })]);

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  while (cleanups.length > 0) await cleanups.pop()!();
});

function runDir(): string {
  const dir = mkdtempSync(join(tmpdir(), 'reef-bus-'));
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

async function keyedMailbox() {
  const key = readBusKeyFile(makeBusKeyFile(runDir()));
  let handled = 0;
  const mailbox = await Mailbox.open({ name: 'keyed', schema: messages, busKey: key, log: () => {}, handlers: { add: (m) => (handled++, { sum: m.a + m.b }) } });
  cleanups.push(() => mailbox.close());
  return { key, mailbox, handled: () => handled };
}

describe('the bus key (CURVE + ZAP)', () => {
  it('a client holding the key is served; a plain peer and one with its own keypair never reach the handler', async () => {
    const { key, mailbox, handled } = await keyedMailbox();
    const plain = await keylessSend(mailbox.endpoint, 'plain', { type: 'add', a: 1, b: 1 });
    cleanups.push(plain.close);
    // Knows the server's public key, which with CURVE alone would have been enough to get in.
    const foreign = await keylessSend(mailbox.endpoint, 'own-key', { type: 'add', a: 2, b: 2 }, key.publicKey);
    cleanups.push(foreign.close);
    expect(plain.outcome).toBe('refused');
    expect(foreign.outcome).toBe('refused');
    expect(foreign.events).toContain('handshake:error:auth');

    const rpc = new RpcClient(mailbox.endpoint, { busKey: key, log: () => {} });
    cleanups.push(() => rpc.close());
    await expect(rpc.call({ type: 'add', a: 20, b: 22 })).resolves.toMatchObject({ sum: 42 });
    expect(handled()).toBe(1);
    expect(mailbox.stats.received).toBe(1);
  });

  it('a client with another stack key is refused', async () => {
    const { mailbox } = await keyedMailbox();
    const other = readBusKeyFile(makeBusKeyFile(runDir()));
    const rpc = new RpcClient(mailbox.endpoint, { busKey: other, defaultTimeoutMs: 300, log: () => {} });
    cleanups.push(() => rpc.close());
    await expect(rpc.call({ type: 'add', a: 1, b: 2 })).rejects.toMatchObject({ code: 'REEF_ERR_TIMEOUT' });
    expect(mailbox.stats.received).toBe(0);
  });

  // A process that binds a restarted shim's or actor's port first (security review M6) must not
  // be taken for it: the client checks the server's key too.
  it('a keyed client gets no answer from an impostor without the secret key at the endpoint', async () => {
    const key = readBusKeyFile(makeBusKeyFile(runDir()));
    const impostor = zmq.curveKeyPair();
    for (const options of [{}, { curveServer: true, curvePublicKey: impostor.publicKey, curveSecretKey: impostor.secretKey }]) {
      const router = new zmq.Router({ linger: 0, ...options });
      await router.bind('tcp://127.0.0.1:*');
      cleanups.push(() => router.close());
      let heard = 0;
      void (async () => {
        for await (const [id] of router) {
          heard++;
          await router.send([id!, Buffer.from([0x80])]).catch(() => {});
        }
      })().catch(() => {});
      const rpc = new RpcClient(router.lastEndpoint!, { busKey: key, defaultTimeoutMs: 500, log: () => {} });
      cleanups.push(() => rpc.close());
      await expect(rpc.call({ type: 'ping' })).rejects.toMatchObject({ code: 'REEF_ERR_TIMEOUT' });
      expect(heard).toBe(0);
    }
  });

  it('the key file is 0600, and one open to others or a symlink is refused', () => {
    const dir = runDir();
    const path = makeBusKeyFile(dir);
    expect(statSync(path).mode & 0o777).toBe(0o600);
    const open = join(dir, 'open.key');
    writeFileSync(open, readFileSyncText(path), { mode: 0o644 });
    expect(() => readBusKeyFile(open)).toThrow(/mode 0600/);
    const link = join(dir, 'link.key');
    symlinkSync(path, link);
    expect(() => readBusKeyFile(link)).toThrow(/cannot read/);
    // A symlink planted where the key goes does not redirect the secret.
    const target = join(dir, 'elsewhere');
    rmSync(path);
    symlinkSync(target, path);
    expect(() => makeBusKeyFile(dir)).toThrow(/cannot write the bus key/);
  });
});

function readFileSyncText(path: string): string {
  return JSON.stringify(readBusKeyFile(path));
}
