"""A trainer's ledger writes, without the trainer: records batch after batch through the real
`Ledger` and answers each one "trained" on stdout only after `record` returns, as
TrainerGroup.step answers after its ledger write. For test_ledger_powerloss.py, under the
power-loss emulation. `--no-dir-fsync` leaves out the fsync of the directory after the rename
(the control: the test must then see answered batches lost)."""

import sys
from pathlib import Path

from reef_shim.trainer import checkpoint
from reef_shim.trainer.checkpoint import Ledger, batch_fingerprint


def main() -> None:
    directory = Path(sys.argv[1])
    if "--no-dir-fsync" in sys.argv:
        checkpoint._fsync = lambda path: None
    ledger = Ledger(directory)
    n = 0
    while True:
        n += 1
        batch_id = f"default:openclawrl:{n}"
        tasks = [{"taskId": f"t{n}-{i}", "reward": (i % 3) - 1.0, "weightVersion": f"v{n - 1}",
                  "promptIds": bytes([n % 256, i]) * 8, "responseIds": bytes([i]) * 4, "teacherPromptIds": []}
                 for i in range(4)]
        fingerprint = batch_fingerprint(tasks)
        ledger.record(batch_id, {"batchId": batch_id, "weightVersion": f"v{n}", "parent": f"v{n - 1}",
                                 "fingerprint": fingerprint})
        print(f"trained {batch_id} {fingerprint}", flush=True)


if __name__ == "__main__":
    main()
