/** The bridge's `Layout` (docs/internals.md, `plan-placement` / `create-placement`) from a config. */
import type { ReefConfig } from './types.js';

export interface Layout {
  trainer: { gpus: number };
  rollout: { gpus: number };
  prm: { gpus: number; replicas: number };
  student: { gpus: number } | null;
  cpusPerBundle: number;
  colocate: boolean;
}

export function layoutFromConfig(cfg: ReefConfig): Layout {
  const c = cfg.cluster;
  return {
    trainer: { gpus: c.trainer.gpus },
    rollout: { gpus: c.rollout.gpus },
    prm: { gpus: c.prm.gpus, replicas: c.prm.replicas },
    student: c.student === null ? null : { gpus: c.student.gpus },
    cpusPerBundle: c.cpus_per_bundle,
    colocate: c.colocate,
  };
}
