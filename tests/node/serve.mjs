// serve.mjs - start `$KVC_BIN serve --port 0 ...args` for the Node.js tests:
// resolves { proc, root } once its "listening on http://HOST:PORT" line is
// seen (root = "http://HOST:PORT"); rejects when it exits or does not start
// within 60 s.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';

export function startServer(args) {
  const bin = process.env.KVC_BIN;
  assert.ok(bin, 'KVC_BIN must name the kvchat binary');
  return new Promise((resolve, reject) => {
    const proc = spawn(bin, ['serve', '--port', '0', ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '', root;
    const timer = setTimeout(() => reject(new Error(`server did not start:\n${log}`)), 60000);
    proc.stderr.on('data', (d) => {
      log += d;
      const m = /listening on (http:\/\/\S+)/.exec(log);
      if (m && !root) {
        clearTimeout(timer);
        root = m[1];
        resolve({ proc, root });
      }
    });
    proc.on('exit', (code) => reject(new Error(`server exited (${code}):\n${log}`)));
  });
}
