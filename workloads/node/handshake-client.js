#!/usr/bin/env node
// handshake-client.js: full TLS handshakes against a server, one request per
// connection, no keep-alive and no session resumption, so every connection
// costs the server a signature and a key exchange.
//
//   node handshake-client.js --port PORT [--host 127.0.0.1] [--duration 10]
//                            [--concurrency 2] [--rate 0]
//
// --rate is handshakes per second over all workers (0 = as fast as they go).
'use strict';
const https = require('https');

const opts = { host: '127.0.0.1', port: 0, duration: 10, concurrency: 2, rate: 0 };
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  const key = argv[i].replace(/^--/, '');
  if (!(key in opts) || i + 1 >= argv.length) {
    console.error(`handshake-client.js: unknown or incomplete argument '${argv[i]}'`);
    process.exit(2);
  }
  opts[key] = key === 'host' ? argv[++i] : Number(argv[++i]);
}
if (!opts.port) {
  console.error('handshake-client.js: --port is required');
  process.exit(2);
}

// maxCachedSessions: 0 turns off TLS session reuse in node's agent.
const agent = new https.Agent({ keepAlive: false, maxCachedSessions: 0 });
const deadline = Date.now() + opts.duration * 1000;
const interval = opts.rate > 0 ? (1000 * opts.concurrency) / opts.rate : 0;
let ok = 0;
let errors = 0;
let stopping = false;

function once() {
  return new Promise((resolve) => {
    const req = https.get({ host: opts.host, port: opts.port, path: '/', agent,
                            rejectUnauthorized: false }, (res) => {
      res.on('data', () => {});
      res.on('end', () => { ok++; resolve(); });
    });
    req.setTimeout(10000, () => req.destroy(new Error('timeout')));
    req.on('error', (e) => {
      if (++errors <= 5) console.error(`handshake-client.js: ${e.message}`);
      resolve();
    });
  });
}

async function worker() {
  let next = Date.now();
  while (!stopping && Date.now() < deadline) {
    await once();
    if (interval > 0) {
      next += interval;
      const wait = next - Date.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    }
  }
}

process.on('SIGTERM', () => { stopping = true; });
process.on('SIGINT', () => { stopping = true; });
Promise.all(Array.from({ length: opts.concurrency }, worker)).then(() => {
  console.log(`handshake-client.js: handshakes=${ok} errors=${errors}`);
  process.exit(ok > 0 ? 0 : 1);
});
