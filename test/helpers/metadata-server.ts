/**
 * An https server on loopback that serves client ID metadata documents, with certificates from a
 * test certificate authority made at test time: orgauth trusts that CA through OUTBOUND_CA_FILE,
 * as an operator's deployment would trust a company CA.
 *
 * Certificates come from the openssl binary (as in test/lib/outbound.test.ts): the server
 * certificate needs subjectAltName, basicConstraints and keyUsage extensions and a CA to sign
 * it, which the minimal DER writer of saml-idp.ts does not do. The README's setup already uses
 * openssl; without it the setup fails loudly instead of skipping what these tests prove.
 */
import { execFileSync } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import type http from 'node:http';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export interface TestCertificateAuthority {
  /** The CA certificate's PEM file: what OUTBOUND_CA_FILE names. */
  caFile: string;
  /** A key and certificate for 127.0.0.1 and localhost, signed by this CA. */
  server: { key: string; cert: string };
  remove(): void;
}

function openssl(args: string[]): void {
  execFileSync('openssl', args, { stdio: ['ignore', 'ignore', 'pipe'] });
}

/** A fresh CA (EC P-256, valid two days) and a server certificate it signed for loopback. */
export function createTestCertificateAuthority(name: string): TestCertificateAuthority {
  const dir = mkdtempSync(join(tmpdir(), 'orgauth-test-ca-'));
  const file = (f: string) => join(dir, f);
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];
  openssl(['req', '-x509', ...ec, '-days', '2', '-subj', `/CN=${name}`, '-keyout', file('ca.key'), '-out', file('ca.pem'),
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign']);
  openssl(['req', ...ec, '-subj', '/CN=127.0.0.1', '-keyout', file('server.key'), '-out', file('server.csr')]);
  writeFileSync(file('server.ext'), [
    'subjectAltName=IP:127.0.0.1,DNS:localhost',
    'basicConstraints=critical,CA:FALSE',
    'keyUsage=critical,digitalSignature',
    'extendedKeyUsage=serverAuth',
    'authorityKeyIdentifier=keyid',
  ].join('\n'));
  openssl(['x509', '-req', '-in', file('server.csr'), '-CA', file('ca.pem'), '-CAkey', file('ca.key'), '-CAcreateserial',
    '-days', '2', '-extfile', file('server.ext'), '-out', file('server.pem')]);
  return {
    caFile: file('ca.pem'),
    server: { key: readFileSync(file('server.key'), 'utf8'), cert: readFileSync(file('server.pem'), 'utf8') },
    remove: () => rmSync(dir, { recursive: true, force: true }),
  };
}

export type Handler = (req: http.IncomingMessage, res: http.ServerResponse) => void;

export interface DocumentServer {
  /** https://127.0.0.1:port */
  origin: string;
  /** Sets what `path` answers; the URL of that path. */
  route(path: string, handler: Handler): string;
  /** Serves `document(url)` as JSON at `path`, with extra response headers; the URL. */
  json(path: string, document: (url: string) => unknown, headers?: Record<string, string>): string;
  /** Requests received for `path`. */
  hits(path: string): number;
  /** TCP connections accepted, whatever came of them. */
  connections(): number;
  close(): Promise<void>;
}

/** An https server on 127.0.0.1 with `tls`'s certificate; unknown paths answer 404. */
export async function startDocumentServer(tls: { key: string; cert: string }): Promise<DocumentServer> {
  const handlers = new Map<string, Handler>();
  const hits = new Map<string, number>();
  let connections = 0;
  const server = https.createServer(tls, (req, res) => {
    const path = (req.url ?? '').split('?')[0] ?? '';
    hits.set(path, (hits.get(path) ?? 0) + 1);
    const handler = handlers.get(path);
    if (handler) handler(req, res);
    else res.writeHead(404, { 'content-type': 'application/json' }).end('{}');
  });
  server.on('connection', () => connections++);
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const origin = `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const route = (path: string, handler: Handler) => {
    handlers.set(path, handler);
    return `${origin}${path}`;
  };
  return {
    origin,
    route,
    json: (path, document, headers = {}) => {
      const url = `${origin}${path}`;
      return route(path, (_req, res) => res.writeHead(200, { 'content-type': 'application/json', ...headers }).end(JSON.stringify(document(url))));
    },
    hits: (path) => hits.get(path) ?? 0,
    connections: () => connections,
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
