import { closeSync, constants, fstatSync, openSync, readFileSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import * as zmq from 'zeromq';
import { ReefError } from './errors.js';

/**
 * The stack's bus key: one CURVE keypair, made at `reef up` into `<data_dir>/run/bus.key` (0600),
 * that every socket of the stack's internal bus (actor mailboxes, the supervisor's control
 * socket, the bridge to the shim) uses to encrypt and to authenticate. Children learn it from
 * `REEF_BUS_KEY`, the file's path: a path in the environment, never the secret on a command line.
 *
 * One keypair for servers and clients alike: every actor both serves a mailbox and calls others,
 * so each holds both secrets anyway, and a second keypair would separate nothing. A server accepts
 * a client only when the client proves it holds this key's secret (its CURVE public key is this
 * key's, checked by the ZAP handler below); a peer that merely knows the public key fails the
 * handshake, and no message of it is ever delivered.
 */
export interface BusKey {
  publicKey: string;
  secretKey: string;
}

export const BUS_KEY_ENV = 'REEF_BUS_KEY';
export const BUS_KEY_FILE = 'bus.key';
/** The ZAP domain of every Reef server socket; the handler refuses any other. */
export const ZAP_DOMAIN = 'reef';
/**
 * Every Reef socket refuses a message larger than this (ZMQ_MAXMSGSIZE) and drops the peer that
 * sent it. The largest legitimate message is a judge lease reply carrying a turn's context and
 * next state, each up to the gateway's 64 MiB body limit; unbounded, one frame could be gigabytes.
 */
export const MAX_MESSAGE_BYTES = 256 * 1024 * 1024;

const Z85_KEY = /^[0-9a-zA-Z.\-:+=^!/*?&<>()[\]{}@%$#]{40}$/;

/** Makes a fresh key file `<runDir>/bus.key` (0600, replacing an earlier stack's) and returns its path. */
export function makeBusKeyFile(runDir: string): string {
  const path = join(runDir, BUS_KEY_FILE);
  const { publicKey, secretKey } = zmq.curveKeyPair();
  writePrivateFile(path, `${JSON.stringify({ publicKey, secretKey })}\n`, 'the bus key');
  return path;
}

/** Writes a file of this user's alone (0600), refusing a symlink or another user's file at `path`. */
export function writePrivateFile(path: string, text: string, what: string): void {
  // O_NOFOLLOW: a symlink planted in the run dir must not redirect what is written elsewhere.
  let fd: number;
  try {
    fd = openSync(path, constants.O_WRONLY | constants.O_CREAT | constants.O_TRUNC | constants.O_NOFOLLOW, 0o600);
  } catch (err) {
    throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: `reef.data_dir: cannot write ${what} ${path}: ${(err as Error).message}` }, { cause: err });
  }
  try {
    checkPrivate(fd, path);
    writeSync(fd, text);
  } finally {
    closeSync(fd);
  }
}

/** Reads a key file; one another user can read, or that is not a Reef key, is refused. */
export function readBusKeyFile(path: string): BusKey {
  let text: string;
  try {
    const fd = openSync(path, constants.O_RDONLY | constants.O_NOFOLLOW);
    try {
      checkPrivate(fd, path);
      text = readFileSync(fd, 'utf8');
    } finally {
      closeSync(fd);
    }
  } catch (err) {
    if (err instanceof ReefError) throw err;
    throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: `${BUS_KEY_ENV}: cannot read the bus key ${path}: ${(err as Error).message}` }, { cause: err });
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = null;
  }
  const key = parsed as Partial<BusKey> | null;
  if (typeof key?.publicKey !== 'string' || typeof key.secretKey !== 'string' || !Z85_KEY.test(key.publicKey) || !Z85_KEY.test(key.secretKey)) {
    throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: `${BUS_KEY_ENV}: ${path} is not a bus key ({"publicKey", "secretKey"}, 40 z85 characters each)` });
  }
  return { publicKey: key.publicKey, secretKey: key.secretKey };
}

function checkPrivate(fd: number, path: string): void {
  const st = fstatSync(fd);
  const uid = process.getuid?.();
  if ((uid !== undefined && st.uid !== uid) || (st.mode & 0o077) !== 0) {
    throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: `the bus key ${path} must be a file of this user's alone (mode 0600), is uid ${st.uid} mode ${(st.mode & 0o777).toString(8)}` });
  }
}

let fromEnv: { path: string; key: BusKey } | null = null;

/** The key of the stack this process belongs to (`REEF_BUS_KEY`), or null outside a stack. */
export function processBusKey(): BusKey | null {
  const path = process.env[BUS_KEY_ENV];
  if (path === undefined || path === '') return null;
  if (fromEnv?.path !== path) fromEnv = { path, key: readBusKeyFile(path) };
  return fromEnv.key;
}

/** Socket options of a server (ROUTER) on the bus; plain when `key` is null (a test's own bus). */
export function serverSocketOptions(key: BusKey | null): Partial<zmq.SocketOptions<zmq.Router>> {
  const limits = { maxMessageSize: MAX_MESSAGE_BYTES };
  if (key === null) return limits;
  // zapEnforceDomain: with no ZAP handler in this process, libzmq would let every CURVE client in
  // (encryption without authentication); enforced, the handshake fails instead.
  return { ...limits, curveServer: true, curvePublicKey: key.publicKey, curveSecretKey: key.secretKey, zapDomain: ZAP_DOMAIN, zapEnforceDomain: true };
}

/** Socket options of a client (DEALER) on the bus. */
export function clientSocketOptions(key: BusKey | null): Partial<zmq.SocketOptions<zmq.Dealer>> {
  const limits = { maxMessageSize: MAX_MESSAGE_BYTES };
  if (key === null) return limits;
  return { ...limits, curveServerKey: key.publicKey, curvePublicKey: key.publicKey, curveSecretKey: key.secretKey };
}

/**
 * The process's ZAP handler (RFC 27), bound at inproc://zeromq.zap.01 in the default context while
 * any CURVE server socket is open. It accepts a client only if its CURVE key is one of the keys the
 * open servers were given. Held by reference count: a handler left waiting keeps Node running.
 */
class ZapHandler {
  private socket: zmq.Reply | null = null;
  private loop: Promise<void> | null = null;
  private readonly allowed = new Map<string, number>();

  async acquire(key: BusKey): Promise<void> {
    this.allowed.set(key.publicKey, (this.allowed.get(key.publicKey) ?? 0) + 1);
    if (this.socket !== null) return;
    const socket = new zmq.Reply({ linger: 0 });
    this.socket = socket;
    try {
      await socket.bind('inproc://zeromq.zap.01');
    } catch (err) {
      this.socket = null;
      socket.close();
      this.release(key);
      throw err;
    }
    this.loop = this.serve(socket);
  }

  release(key: BusKey): void {
    const n = (this.allowed.get(key.publicKey) ?? 0) - 1;
    if (n > 0) this.allowed.set(key.publicKey, n);
    else this.allowed.delete(key.publicKey);
    if (this.allowed.size > 0 || this.socket === null) return;
    this.socket.close();
    this.socket = null;
  }

  private async serve(socket: zmq.Reply): Promise<void> {
    for (;;) {
      let frames: Buffer[];
      try {
        frames = await socket.receive();
      } catch {
        return; // closed by release()
      }
      // version, request id, domain, address, identity, mechanism, credentials...
      const [version, requestId, domain, , , mechanism, credential] = frames;
      const client = credential !== undefined && credential.length === 32 ? z85(credential) : null;
      const ok = version?.toString() === '1.0' && domain?.toString() === ZAP_DOMAIN && mechanism?.toString() === 'CURVE' && client !== null && this.allowed.has(client);
      try {
        await socket.send(['1.0', requestId ?? '', ok ? '200' : '400', ok ? 'OK' : 'not a key of this stack', '', '']);
      } catch {
        if (socket.closed) return;
      }
    }
  }
}

const zap = new ZapHandler();

/** Binds the ZAP handler (if not yet) and allows `key`'s clients; pair with `releaseZap`. */
export function acquireZap(key: BusKey): Promise<void> {
  return zap.acquire(key);
}

export function releaseZap(key: BusKey): void {
  zap.release(key);
}

const Z85_CHARS = '0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#';

/** Z85 (ZeroMQ RFC 32) of a key's 32 bytes, as curveKeyPair writes keys. */
export function z85(bytes: Uint8Array): string {
  let out = '';
  for (let i = 0; i < bytes.length; i += 4) {
    let value = ((bytes[i]! << 24) >>> 0) + (bytes[i + 1]! << 16) + (bytes[i + 2]! << 8) + bytes[i + 3]!;
    let chunk = '';
    for (let j = 0; j < 5; j++) {
      chunk = Z85_CHARS[value % 85]! + chunk;
      value = Math.floor(value / 85);
    }
    out += chunk;
  }
  return out;
}
