// Compiles in a worker thread (`compileAsync`): a type check takes 15–40 s of synchronous work
// on a loaded 2-core machine, and a test worker that never yields that long cannot answer
// vitest's own RPC (its fixed 60 s timeout fails a green run: "Timeout calling onTaskUpdate").
import { isMainThread, parentPort, Worker, workerData } from 'node:worker_threads';
import ts from 'typescript';

/** Resolves with `{ sourceFiles, diagnostics: [{ fileName, line, code, text }] }`. */
export function compileAsync(files, options) {
  return new Promise((resolvePromise, reject) => {
    const worker = new Worker(new URL(import.meta.url), { workerData: { files, options } });
    worker.once('message', resolvePromise);
    worker.once('error', reject);
    worker.once('exit', (code) => code !== 0 && reject(new Error(`the compile worker exited with ${code}`)));
  });
}

if (!isMainThread && workerData?.files) {
  const program = ts.createProgram(workerData.files, workerData.options);
  parentPort.postMessage({
    sourceFiles: program.getSourceFiles().map((f) => f.fileName),
    diagnostics: ts.getPreEmitDiagnostics(program).map((d) => ({
      fileName: d.file?.fileName ?? null,
      line: d.file ? d.file.getLineAndCharacterOfPosition(d.start ?? 0).line + 1 : null,
      code: d.code,
      text: ts.flattenDiagnosticMessageText(d.messageText, '\n'),
    })),
  });
}
