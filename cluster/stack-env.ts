/** Engine URLs every actor gets in `REEF_ENGINES` (JSON), set by the stack (cluster/stack.ts). */
export interface StackEngines {
  rollout: string;
  prm: string[];
  student: string | null;
  /** The Python shim's bridge endpoint (the trainer-controller drives training through it). */
  shim: string | null;
}

/** Reads `REEF_ENGINES` in an actor process; null when the actor runs outside a stack. */
export function stackEngines(env: NodeJS.ProcessEnv = process.env): StackEngines | null {
  const raw = env.REEF_ENGINES;
  return raw ? (JSON.parse(raw) as StackEngines) : null;
}
