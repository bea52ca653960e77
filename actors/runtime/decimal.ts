/**
 * The number a text states in decimal (`12`, ` 12.5 `, `+1e3`, `.5`), as Python's float() reads
 * such text; NaN for anything else. `Number()` alone also takes `0x10`, `0b11` and `Infinity`,
 * so a CLI flag or an environment variable the shim reads too would mean another number here.
 */
export function decimalNumber(text: string): number {
  return /^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$/.test(text) ? Number(text) : Number.NaN;
}
