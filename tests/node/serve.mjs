// serve.mjs - start `$KVC_BIN serve --port 0 ...args` for the Node.js tests:
// resolves { proc, root } once its "listening on http://HOST:PORT" line is
// seen (root = "http://HOST:PORT"); rejects when it exits or does not start
// within 60 s. Also what several test files share: the server on the demo
// model with tests/node/hermes.jinja, and packages that may be absent.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

/* The Hermes-style chat template (tool calls as <tool_call> JSON) the tests
 * run the generated demo model with. */
export const HERMES = path.join(path.dirname(fileURLToPath(import.meta.url)), 'hermes.jinja');

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

/* startServer on the demo model with HERMES, two slots, no disk tier and
 * the API key `key`; `more` arguments after those. */
export function startHermesServer(key, more = []) {
  return startServer(['--parallel', '2', '--cache-disk', '0', '--api-key', key,
                      '--chat-template-file', HERMES, ...more]);
}

/* The module, or null when it is not installed (its tests then skip). */
export async function optional(name) {
  try {
    return await import(name);
  } catch (e) {
    if (e.code === 'ERR_MODULE_NOT_FOUND')
      return null;
    throw e;
  }
}
