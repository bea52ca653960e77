// Writes docs/errors.md from the error registry (actors/runtime/errors.ts; the text is
// actors/runtime/errors-doc.ts, compiled in dist/). test/docs/errors-doc.test.ts fails when the doc
// is not what this writes: run `npm run errors:doc`.
import { writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const { ERRORS } = await import(join(root, 'dist/actors/runtime/errors.js'));
const { renderErrorsDoc } = await import(join(root, 'dist/actors/runtime/errors-doc.js'));
writeFileSync(join(root, 'docs/errors.md'), renderErrorsDoc(ERRORS));
console.log(`docs/errors.md: ${Object.keys(ERRORS).length} codes`);
