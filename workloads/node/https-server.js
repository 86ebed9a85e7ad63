#!/usr/bin/env node
// https-server.js: node's https module serving a fixed-size body, so a
// profile of this process shows the OpenSSL that node embeds (full symbols).
//
//   node https-server.js --cert cert.pem --key key.pem [--port 0] [--host 127.0.0.1]
//                        [--size 16384] [--ready-file FILE]
//
// The ready file gets the port once the server listens. SIGTERM/SIGINT close
// the server and print a one-line summary.
'use strict';
const fs = require('fs');
const https = require('https');

function parseArgs(argv) {
  const opts = { port: 0, host: '127.0.0.1', size: 16384, cert: '', key: '', readyFile: '' };
  const names = { '--port': 'port', '--host': 'host', '--size': 'size', '--cert': 'cert',
                  '--key': 'key', '--ready-file': 'readyFile' };
  for (let i = 0; i < argv.length; i++) {
    const name = names[argv[i]];
    if (!name || i + 1 >= argv.length) {
      console.error(`https-server.js: unknown or incomplete argument '${argv[i]}'`);
      process.exit(2);
    }
    opts[name] = argv[++i];
  }
  opts.port = Number(opts.port);
  opts.size = Number(opts.size);
  if (!opts.cert || !opts.key) {
    console.error('https-server.js: --cert and --key are required (make them with make-cert.sh DIR)');
    process.exit(2);
  }
  return opts;
}

const opts = parseArgs(process.argv.slice(2));
let tlsOptions;
try {
  tlsOptions = { cert: fs.readFileSync(opts.cert), key: fs.readFileSync(opts.key) };
} catch (e) {
  console.error(`https-server.js: cannot read certificate or key: ${e.message}`);
  process.exit(1);
}
const body = Buffer.alloc(opts.size, 'x');
let requests = 0;
let handshakes = 0;
let tlsErrors = 0;
const start = Date.now();

const server = https.createServer(tlsOptions, (req, res) => {
  requests++;
  res.writeHead(200, { 'Content-Type': 'application/octet-stream', 'Content-Length': body.length });
  res.end(body);
});
server.on('secureConnection', () => { handshakes++; });
server.on('tlsClientError', () => { tlsErrors++; });
server.on('error', (e) => {
  console.error(`https-server.js: ${e.message}`);
  process.exit(1);
});
server.listen(opts.port, opts.host, () => {
  const port = server.address().port;
  if (opts.readyFile) {
    // Write then rename so a poller never sees a half-written file.
    fs.writeFileSync(opts.readyFile + '.tmp', `${port}\n`);
    fs.renameSync(opts.readyFile + '.tmp', opts.readyFile);
  }
  console.error(`https-server.js: listening on ${opts.host}:${port} (pid ${process.pid})`);
});

function stop() {
  const secs = (Date.now() - start) / 1000;
  console.log(`https-server.js: ${secs.toFixed(1)}s handshakes=${handshakes} requests=${requests} ` +
              `tls_errors=${tlsErrors}`);
  server.close();
  process.exit(0);
}
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
