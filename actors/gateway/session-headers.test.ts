import { describe, expect, it } from 'vitest';
import { sessionHeaders } from './session-headers.js';

describe('sessionHeaders: the session_id header @openclaw/ai sends', () => {
  it('tags the session when no other header names it', () => {
    expect(sessionHeaders({ session_id: ' oc-1 ' })).toEqual({ tags: { session: 'oc-1' } });
  });

  it('yields to x-session-id and x-reef-tag-session, without a disagreement refusal', () => {
    expect(sessionHeaders({ session_id: 'cache-key', 'x-session-id': 'oc-1' })).toEqual({ tags: { session: 'oc-1' } });
    expect(sessionHeaders({ session_id: 'cache-key', 'x-reef-tag-session': 'tagged' })).toEqual({ tags: { session: 'tagged' } });
  });

  it('is a session x-session-done can end; an empty one is no session', () => {
    expect(sessionHeaders({ session_id: 'oc-1', 'x-session-done': 'true' })).toEqual({ tags: { session: 'oc-1', 'session-done': 'true' } });
    expect(sessionHeaders({ session_id: '' })).toEqual({ tags: {} });
    expect(sessionHeaders({ session_id: '', 'x-session-done': '1' })).toMatchObject({ param: 'x-session-done' });
  });
});
