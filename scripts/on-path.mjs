// Whether an executable named `bin` is in one of PATH's directories: the scripts' way to tell a
// missing tool before they need it (ensure-built.mjs: bubblewrap and socat; test.mjs: chrt).
import { existsSync } from 'node:fs';
import { delimiter, join } from 'node:path';

export const onPath = (bin) => (process.env.PATH ?? '').split(delimiter).some((d) => d && existsSync(join(d, bin)));
