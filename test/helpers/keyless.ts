import * as zmq from 'zeromq';
import { encode } from '../../actors/runtime/codec.js';

/**
 * A peer without the stack's bus key, as a local attacker would be: a plain DEALER, or one with a
 * CURVE keypair of its own that knows the server's public key (public in the sense that nothing
 * guards it). It sends `msg` and reports how its handshakes ended; a peer the server refuses never
 * gets a connection its message could go out on.
 */
export type KeylessKind = 'plain' | 'own-key';

export interface KeylessAttempt {
  /** The first handshake outcome the socket reported: 'refused' (a handshake error) or 'accepted'. */
  outcome: 'refused' | 'accepted';
  events: string[];
  close: () => void;
}

export async function keylessSend(endpoint: string, kind: KeylessKind, msg: Record<string, unknown>, serverPublicKey: string | null = null): Promise<KeylessAttempt> {
  const own = zmq.curveKeyPair();
  const dealer = new zmq.Dealer({
    linger: 0,
    sendTimeout: 0,
    ...(kind === 'own-key' ? { curveServerKey: serverPublicKey ?? own.publicKey, curvePublicKey: own.publicKey, curveSecretKey: own.secretKey } : {}),
  });
  const events: string[] = [];
  const outcome = new Promise<'refused' | 'accepted'>((resolve) => {
    void (async () => {
      for await (const event of dealer.events) {
        events.push(event.type);
        if (event.type.startsWith('handshake:error')) resolve('refused');
        // A NULL client to a CURVE server sees the server close the connection mid-greeting.
        if (event.type === 'disconnect' && kind === 'plain') resolve('refused');
        if (event.type === 'handshake') resolve('accepted');
        if (event.type === 'end') return;
      }
    })().catch(() => {});
  });
  dealer.connect(endpoint);
  // Queued until a handshake succeeds, so it is delivered only if one ever does.
  void dealer.send([encode({ requestId: 'attacker-1', ...msg })]).catch(() => {});
  return { outcome: await outcome, events, close: () => dealer.close() };
}
