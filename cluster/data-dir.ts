import { chmodSync, mkdirSync, statSync } from 'node:fs';
import { isMainThread } from 'node:worker_threads';
import { ReefError } from '../actors/runtime/errors.js';

/**
 * Makes the stack's data dir its owner's alone before anything is written in it: records hold every
 * scenario's transcripts, and checkpoints the weights trained on them. From here on the process
 * and every process it starts (they inherit the umask) create files 0600 and directories 0700;
 * SQLite's own default for a new database is 0644. A data dir another user owns is refused, as
 * PostgreSQL refuses a data directory it does not own; one that is open to others (made by an
 * earlier version, or by hand) is closed, and the log says so.
 */
export function ownDataDir(dir: string, log: (line: string) => void): void {
  // A worker thread cannot set it (Node throws): the process's umask applies, and the mode below.
  if (isMainThread) process.umask(0o077);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const st = statSync(dir);
  const uid = process.getuid?.();
  if (uid !== undefined && st.uid !== uid) {
    throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: `reef.data_dir ${dir} belongs to uid ${st.uid}, not to this user (uid ${uid}): give the stack a data dir of its own` });
  }
  const mode = st.mode & 0o777;
  if ((mode & 0o077) !== 0) {
    chmodSync(dir, 0o700);
    log(`reef.data_dir ${dir} was open to other users (mode ${mode.toString(8)}); made it 0700`);
  }
}
