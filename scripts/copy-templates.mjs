// The files beside the compiled code that tsc does not copy: page and mail templates, the
// stylesheet. `node scripts/copy-templates.mjs [dist]` copies them from src/ into dist/src/ (the
// build) or into another output folder (bench/revocations-volume.ts builds the tree elsewhere).
import { cpSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const TEMPLATE_FOLDERS = ['web/views', 'web/assets', 'mail/views'];

export function copyTemplates(dist) {
  const root = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
  for (const folder of TEMPLATE_FOLDERS) cpSync(path.join(root, 'src', folder), path.join(dist, 'src', folder), { recursive: true });
}

if (process.argv[1] === fileURLToPath(import.meta.url)) copyTemplates(path.resolve(process.argv[2] ?? 'dist'));
