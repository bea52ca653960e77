import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { repoRoot } from '../../cluster/paths.js';

/**
 * Trainer rank 0 of a weight update group, as a real torch process (python_shim/tests/weight_rank0.py)
 * driven by the test: the test makes the engine's HTTP calls and this process takes part in the
 * collectives they start. It also wrote a changed copy of the model, whose tensors it sends.
 */

type Event = Record<string, any> & { event: string };

export interface AnnouncedTensors {
  names: string[];
  dtypes: string[];
  shapes: number[][];
}

export class WeightSender {
  private readonly events: Event[] = [];
  private waiter: (() => void) | null = null;
  private exited: string | null = null;
  private log = '';

  private constructor(private readonly child: ChildProcess, readonly checkpoint: string) {
    createInterface({ input: child.stdout! }).on('line', (line) => {
      if (!line.startsWith('{')) return;
      this.events.push(JSON.parse(line) as Event);
      this.waiter?.();
    });
    child.stderr!.on('data', (d: Buffer) => { this.log = (this.log + d.toString()).slice(-8000); });
    child.once('exit', (code, signal) => {
      this.exited = `exited (${code ?? signal})`;
      this.waiter?.();
    });
  }

  /** Starts the sender; it writes the changed model to `checkpoint` and announces its tensors. */
  static async start(opts: { python: string; env: NodeJS.ProcessEnv; modelPath: string; checkpoint: string; backend: 'gloo' | 'nccl'; timeoutMs?: number }): Promise<{ sender: WeightSender; tensors: AnnouncedTensors }> {
    const script = join(repoRoot(), 'python_shim', 'tests', 'weight_rank0.py');
    const child = spawn(opts.python, [script, '--model-path', opts.modelPath, '--out', opts.checkpoint, '--backend', opts.backend], { env: opts.env, stdio: ['pipe', 'pipe', 'pipe'] });
    const sender = new WeightSender(child, opts.checkpoint);
    try {
      const ready = await sender.next('ready', opts.timeoutMs ?? 300_000);
      return { sender, tensors: { names: ready.names, dtypes: ready.dtypes, shapes: ready.shapes } };
    } catch (err) {
      await sender.kill();
      throw err;
    }
  }

  get alive(): boolean {
    return this.exited === null;
  }

  /** The next event, which must be `name` (an `error` event or an exit rejects). */
  async next(name: string, timeoutMs = 120_000): Promise<Event> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const e = this.events.shift();
      if (e) {
        if (e.event !== name) throw new Error(`weight sender: expected "${name}", got ${JSON.stringify(e)}\n${this.log}`);
        return e;
      }
      if (this.exited) throw new Error(`weight sender ${this.exited} while waiting for "${name}":\n${this.log}`);
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`weight sender: no "${name}" within ${timeoutMs} ms\n${this.log}`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.waiter = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.waiter = null;
    }
  }

  /** Hosts the group's rendezvous and starts joining it as rank 0; `joined` follows once the engine joined. */
  async listen(worldSize: number, groupName: string): Promise<{ masterAddress: string; masterPort: number }> {
    this.command({ op: 'listen', world_size: worldSize, group_name: groupName });
    const e = await this.next('listening');
    return { masterAddress: e.master_address, masterPort: e.master_port };
  }

  joined(): Promise<Event> {
    return this.next('joined');
  }

  /** Broadcasts the first `count` tensors (all by default); resolves once rank 0's part is done. */
  async send(count: number | null = null): Promise<number> {
    this.command({ op: 'send', count });
    return (await this.next('sent')).count as number;
  }

  async leave(): Promise<void> {
    this.command({ op: 'leave' });
    await this.next('left');
  }

  /** SIGKILL, the way a trainer dies: no goodbye to the group. */
  async kill(): Promise<void> {
    if (this.exited) return;
    const gone = new Promise<void>((resolve) => this.child.once('exit', () => resolve()));
    this.child.kill('SIGKILL');
    await gone;
  }

  private command(body: Record<string, unknown>): void {
    if (this.exited) throw new Error(`weight sender ${this.exited}:\n${this.log}`);
    this.child.stdin!.write(`${JSON.stringify(body)}\n`);
  }
}
