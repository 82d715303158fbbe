/**
 * The guarded outbound client against real servers on loopback: no mocks. A refusal is shown by
 * the target server never seeing a connection, not only by the rejection. Every address that a
 * request could reach is on this machine (127.0.0.0/8): the private and link-local literals are
 * tried with an already-aborted signal (see below), and the rebinding resolver's second answer
 * is another loopback address.
 */
import { execFileSync } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { BlockList } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import * as client from 'openid-client';
import { afterEach, describe, expect, it, vi } from 'vitest';
import {
  createOutboundFetch,
  isSpecialUseAddress,
  OutboundRefusedError,
  type OutboundPolicy,
  type ResolveHostname,
} from '../../src/lib/outbound.js';

interface SeenRequest {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
  body: string;
}

interface TestServer {
  port: number;
  origin: string;
  connections: number;
  requests: SeenRequest[];
  close(): Promise<void>;
}

const servers: { close(): Promise<void> }[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close()));
});

function track<S extends http.Server | https.Server>(server: S, host: string): Promise<TestServer> {
  const seen: TestServer = {
    port: 0,
    origin: '',
    connections: 0,
    requests: [],
    close: async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
  server.on('connection', () => seen.connections++);
  servers.push(seen);
  return once(server, 'listening').then(() => {
    seen.port = (server.address() as AddressInfo).port;
    seen.origin = `http://${host}:${seen.port}`;
    return seen;
  });
}

/** A node:http server that records each request (with its whole body) before `handle` answers it. */
function startServer(handle: (req: http.IncomingMessage, res: http.ServerResponse) => void, host = '127.0.0.1', port = 0): Promise<TestServer> {
  let seen: TestServer | undefined;
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      seen?.requests.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, body: Buffer.concat(chunks).toString() });
      handle(req, res);
    });
  });
  server.listen(port, host);
  return track(server, host).then((s) => (seen = s));
}

const ok = (_req: http.IncomingMessage, res: http.ServerResponse): void => {
  res.writeHead(200, { 'content-type': 'text/plain', 'x-test': 'yes' });
  res.end('hello');
};

const LOOPBACK: OutboundPolicy = { allowHttp: true, allowedNetworks: ['127.0.0.0/8'], timeoutMs: 5_000, maxBytes: 64 * 1024 };
const STRICT: OutboundPolicy = { ...LOOPBACK, allowedNetworks: [] };

async function refusal(promise: Promise<unknown>): Promise<OutboundRefusedError> {
  const error: unknown = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(OutboundRefusedError);
  if (!(error instanceof OutboundRefusedError)) throw new Error('unreachable');
  return error;
}

describe('requests that the policy allows', () => {
  it('GETs with status, body and headers, sending the hostname as Host', async () => {
    const server = await startServer(ok);
    const response = await createOutboundFetch(LOOPBACK)(`${server.origin}/path?q=1`, { headers: { accept: 'text/plain' } });
    expect(response.status).toBe(200);
    expect(response.headers.get('x-test')).toBe('yes');
    expect(await response.text()).toBe('hello');
    expect(server.requests).toHaveLength(1);
    expect(server.requests[0]).toMatchObject({ method: 'GET', url: '/path?q=1' });
    expect(server.requests[0]?.headers).toMatchObject({ host: `127.0.0.1:${server.port}`, accept: 'text/plain', 'user-agent': 'orgauth' });
  });

  it('POSTs a body, with its headers, and fills content-type from the body type as fetch does', async () => {
    const server = await startServer((_req, res) => res.writeHead(201).end());
    const outbound = createOutboundFetch(LOOPBACK);
    const json = await outbound(`${server.origin}/hook`, {
      method: 'post',
      headers: { 'content-type': 'application/json', 'x-signature': 'sig' },
      body: '{"event":"ping"}',
    });
    expect(json.status).toBe(201);
    const form = await outbound(`${server.origin}/token`, { method: 'POST', body: new URLSearchParams({ grant_type: 'client_credentials' }) });
    expect(form.status).toBe(201);
    const bytes = await outbound(`${server.origin}/raw`, { method: 'PUT', body: new Uint8Array([104, 105]) });
    expect(bytes.status).toBe(201);

    const [first, second, third] = server.requests;
    expect(first).toMatchObject({ method: 'POST', url: '/hook', body: '{"event":"ping"}' });
    expect(first?.headers).toMatchObject({ 'content-type': 'application/json', 'x-signature': 'sig', 'content-length': '16' });
    expect(second).toMatchObject({ body: 'grant_type=client_credentials' });
    expect(second?.headers['content-type']).toBe('application/x-www-form-urlencoded;charset=UTF-8');
    expect(third).toMatchObject({ method: 'PUT', body: 'hi' });
  });

  it('resolves a hostname (localhost) and connects when its addresses are allowed', async () => {
    const server = await startServer(ok);
    const response = await createOutboundFetch({ ...LOOPBACK, allowedNetworks: ['127.0.0.0/8', '::1/128'] })(`http://localhost:${server.port}/`);
    expect(await response.text()).toBe('hello');
    expect(server.requests[0]?.headers.host).toBe(`localhost:${server.port}`);
  });

  it('returns a 204 and a HEAD with no body', async () => {
    const server = await startServer((req, res) => (req.url === '/empty' ? res.writeHead(204).end() : ok(req, res)));
    const outbound = createOutboundFetch(LOOPBACK);
    const empty = await outbound(`${server.origin}/empty`);
    expect(empty.status).toBe(204);
    expect(empty.body).toBeNull();
    const head = await outbound(`${server.origin}/`, { method: 'HEAD' });
    expect(head.status).toBe(200);
    expect(head.headers.get('x-test')).toBe('yes');
    expect(await head.text()).toBe('');
  });

  it('decodes a gzip body and drops the headers that described the coded bytes', async () => {
    const document = JSON.stringify({ keys: Array.from({ length: 50 }, (_, i) => ({ kid: `k${i}` })) });
    const server = await startServer((_req, res) => res.writeHead(200, { 'content-type': 'application/json', 'content-encoding': 'gzip' }).end(gzipSync(document)));
    const response = await createOutboundFetch(LOOPBACK)(`${server.origin}/jwks`);
    expect(await response.json()).toEqual(JSON.parse(document));
    expect(response.headers.get('content-encoding')).toBeNull();
    expect(server.requests[0]?.headers['accept-encoding']).toBe('gzip, deflate, br');
  });

  it('is the fetch openid-client takes as customFetch: discovery works through it', async () => {
    const server = await startServer((req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ issuer: `http://127.0.0.1:${server.port}`, authorization_endpoint: `http://127.0.0.1:${server.port}/authorize` }));
    });
    // The assignment is the type check: the lead wires it exactly like this.
    const customFetch: client.CustomFetch = createOutboundFetch(LOOPBACK);
    const config = await client.discovery(new URL(server.origin), 'orgauth', undefined, undefined, {
      [client.customFetch]: customFetch,
      execute: [client.allowInsecureRequests],
    });
    expect(config.serverMetadata().authorization_endpoint).toBe(`${server.origin}/authorize`);
    expect(server.requests[0]?.url).toBe('/.well-known/openid-configuration');
  });
});

describe('refused before any connection', () => {
  it.each([
    ['IPv4 loopback', (port: number) => `http://127.0.0.1:${port}/`],
    ['IPv6 loopback', (port: number) => `http://[::1]:${port}/`],
    ['a name that resolves to loopback', (port: number) => `http://localhost:${port}/`],
    ['IPv4-mapped IPv6 loopback', (port: number) => `http://[::ffff:127.0.0.1]:${port}/`],
    ['IPv4-compatible IPv6 loopback', (port: number) => `http://[::127.0.0.1]:${port}/`],
    ['loopback as one decimal number', (port: number) => `http://2130706433:${port}/`],
    ['loopback in hex and short form', (port: number) => `http://0x7f.1:${port}/`],
    ['loopback in octal', (port: number) => `http://0177.0.0.1:${port}/`],
    ['the unspecified address', (port: number) => `http://0.0.0.0:${port}/`],
  ])('%s', async (_label, url) => {
    const server = await startServer(ok);
    const error = await refusal(createOutboundFetch(STRICT)(url(server.port)));
    expect(error.reason).toMatch(/special-use/);
    expect(server.connections).toBe(0);
  });

  // Off this machine, so no server can show the absence of a connection. The signal is already
  // aborted: literals are checked before it is honoured, so the refusal still comes, and should
  // the check ever regress the request ends as an abort instead of a packet to the address.
  it.each(['http://169.254.169.254/latest/meta-data/', 'http://10.0.0.1/', 'https://192.168.1.1/', 'http://[fd00::1]/'])('%s', async (url) => {
    const error = await refusal(createOutboundFetch(STRICT)(url, { signal: AbortSignal.abort() }));
    expect(error.reason).toMatch(/special-use/);
  });

  it('plain http when the policy wants https', async () => {
    const server = await startServer(ok);
    const error = await refusal(createOutboundFetch({ ...LOOPBACK, allowHttp: false })(`${server.origin}/`));
    expect(error.reason).toMatch(/http/);
    expect(server.connections).toBe(0);
  });

  it.each(['ftp://127.0.0.1/file', 'file:///etc/passwd', 'data:text/plain,hi', 'gopher://127.0.0.1:70/', 'not a url'])('%s', async (url) => {
    await refusal(createOutboundFetch(LOOPBACK)(url));
  });

  it('a URL with userinfo', async () => {
    const server = await startServer(ok);
    const error = await refusal(createOutboundFetch(LOOPBACK)(`http://user:secret@127.0.0.1:${server.port}/`));
    expect(error.reason).toMatch(/credentials/);
    await refusal(createOutboundFetch(LOOPBACK)(`http://trusted.example@127.0.0.1:${server.port}/`));
    expect(server.connections).toBe(0);
  });

  it('a name with one refused address among allowed ones, and a name with none', async () => {
    const server = await startServer(ok);
    const lookup: ResolveHostname = async () => [
      { address: '127.0.0.1', family: 4 },
      { address: '127.0.0.2', family: 4 },
    ];
    const policy = { ...LOOPBACK, allowedNetworks: ['127.0.0.1/32'] };
    const error = await refusal(createOutboundFetch(policy, { lookup })(`http://mixed.test:${server.port}/`));
    expect(error.reason).toBe('mixed.test resolves to special-use address 127.0.0.2');
    await refusal(createOutboundFetch(policy, { lookup: async () => [] })(`http://nothing.test:${server.port}/`));
    expect(server.connections).toBe(0);
  });
});

describe('pinning', () => {
  it('connects to the address it checked: a rebinding resolver is asked once', async () => {
    // The checked answer is 127.0.0.1 (allowed); every later answer is 127.0.0.2, which the
    // policy refuses and where a second server listens on the same port to catch a re-resolve.
    const pinned = await startServer(ok, '127.0.0.1');
    const rebound = await startServer(ok, '127.0.0.2', pinned.port);
    const asked: string[] = [];
    const lookup: ResolveHostname = async (hostname) => {
      asked.push(hostname);
      return [{ address: asked.length === 1 ? '127.0.0.1' : '127.0.0.2', family: 4 }];
    };
    const outbound = createOutboundFetch({ ...LOOPBACK, allowedNetworks: ['127.0.0.1/32'] }, { lookup });
    const response = await outbound(`http://rebind.test:${pinned.port}/`);
    expect(await response.text()).toBe('hello');
    expect(asked).toEqual(['rebind.test']);
    expect(pinned.requests[0]?.headers.host).toBe(`rebind.test:${pinned.port}`);
    expect(rebound.connections).toBe(0);

    // The next request resolves again, gets the rebound answer, and is refused before connecting.
    const error = await refusal(outbound(`http://rebind.test:${pinned.port}/`));
    expect(error.reason).toMatch(/127\.0\.0\.2/);
    expect(rebound.connections).toBe(0);
    expect(pinned.connections).toBe(1);
  });

  const openssl = (() => {
    try {
      execFileSync('openssl', ['version'], { stdio: 'ignore' });
      return true;
    } catch {
      return false;
    }
  })();

  it.skipIf(!openssl)('keeps TLS on the hostname: SNI is the name and an untrusted certificate fails', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'outbound-tls-'));
    try {
      execFileSync('openssl', [
        'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-days', '1',
        '-subj', '/CN=idp.test', '-addext', 'subjectAltName=DNS:idp.test',
        '-keyout', join(dir, 'key.pem'), '-out', join(dir, 'cert.pem'),
      ], { stdio: 'ignore' });
      const names: string[] = [];
      const server = https.createServer({
        key: readFileSync(join(dir, 'key.pem')),
        cert: readFileSync(join(dir, 'cert.pem')),
        SNICallback: (name, done) => {
          names.push(name);
          done(null);
        },
      }, ok);
      server.listen(0, '127.0.0.1');
      const tracked = await track(server, '127.0.0.1');
      const outbound = createOutboundFetch({ ...STRICT, allowHttp: false, allowedNetworks: ['127.0.0.1/32'] }, { lookup: async () => [{ address: '127.0.0.1', family: 4 }] });
      const error: unknown = await outbound(`https://idp.test:${tracked.port}/`).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(Error);
      expect(error).not.toBeInstanceOf(OutboundRefusedError);
      expect(String((error as NodeJS.ErrnoException).code)).toMatch(/SELF_SIGNED|UNABLE_TO_VERIFY/);
      expect(names).toEqual(['idp.test']);
      expect(tracked.requests).toHaveLength(0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('redirects are returned, never followed', () => {
  it.each([undefined, 'manual', 'follow'] as const)('redirect: %s', async (redirect) => {
    const elsewhere = await startServer(ok);
    const server = await startServer((_req, res) => res.writeHead(302, { location: `${elsewhere.origin}/next` }).end());
    const response = await createOutboundFetch(LOOPBACK)(`${server.origin}/start`, redirect ? { redirect } : {});
    expect(response.status).toBe(302);
    expect(response.headers.get('location')).toBe(`${elsewhere.origin}/next`);
    expect(elsewhere.connections).toBe(0);
  });

  it("redirect: 'error' rejects, as fetch does", async () => {
    const elsewhere = await startServer(ok);
    const server = await startServer((_req, res) => res.writeHead(307, { location: `${elsewhere.origin}/` }).end());
    const error = await refusal(createOutboundFetch(LOOPBACK)(`${server.origin}/`, { redirect: 'error' }));
    expect(error.reason).toMatch(/redirect/);
    expect(elsewhere.connections).toBe(0);
  });
});

describe('limits', () => {
  const small: OutboundPolicy = { ...LOOPBACK, maxBytes: 1024 };

  it('refuses a body over maxBytes, declared or streamed', async () => {
    const big = 'x'.repeat(4096);
    const server = await startServer((req, res) => {
      if (req.url === '/declared') res.writeHead(200, { 'content-length': big.length }).end(big);
      else {
        // No content-length: chunked, so only counting the bytes can catch it.
        res.writeHead(200);
        for (let i = 0; i < 8; i++) res.write(big);
        res.end();
      }
    });
    const outbound = createOutboundFetch(small);
    expect((await refusal(outbound(`${server.origin}/declared`))).reason).toBe('response too large');
    expect((await refusal(outbound(`${server.origin}/chunked`))).reason).toBe('response too large');
    const exact = await startServer((_req, res) => res.end('y'.repeat(1024)));
    expect((await (await outbound(`${exact.origin}/`)).text()).length).toBe(1024);
  });

  it('refuses a compressed body that decodes past maxBytes (a zip bomb)', async () => {
    const bomb = gzipSync(Buffer.alloc(1024 * 1024));
    expect(bomb.length).toBeLessThan(1024 * 8);
    const server = await startServer((_req, res) => res.writeHead(200, { 'content-encoding': 'gzip' }).end(bomb));
    const error = await refusal(createOutboundFetch({ ...LOOPBACK, maxBytes: 64 * 1024 })(`${server.origin}/`));
    expect(error.reason).toBe('response too large');
  });

  it('rejects a server that never answers, and one that stalls mid-body', async () => {
    const silent = await startServer(() => undefined);
    const stalling = await startServer((_req, res) => {
      res.writeHead(200, { 'content-length': 100 });
      res.write('partial');
    });
    const outbound = createOutboundFetch({ ...LOOPBACK, timeoutMs: 300 });
    const [never, partial] = await Promise.all([
      outbound(`${silent.origin}/`).catch((e: unknown) => e),
      outbound(`${stalling.origin}/`).catch((e: unknown) => e),
    ]);
    expect(never).toBeInstanceOf(DOMException);
    expect((never as DOMException).name).toBe('TimeoutError');
    expect((partial as DOMException).name).toBe('TimeoutError');
    expect(silent.requests).toHaveLength(1);
  });

  it('rejects a body cut short, rather than returning the part that arrived', async () => {
    const server = await startServer((req, res) => {
      res.writeHead(200, { 'content-length': 100 });
      res.write('partial', () => req.socket.destroy());
    });
    const error: unknown = await createOutboundFetch(LOOPBACK)(`${server.origin}/`).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(Error);
    expect(error).not.toBeInstanceOf(OutboundRefusedError);
  });

  it("rejects with the caller's abort reason", async () => {
    const silent = await startServer(() => undefined);
    const controller = new AbortController();
    const pending = createOutboundFetch(LOOPBACK)(`${silent.origin}/`, { signal: controller.signal }).catch((e: unknown) => e);
    await vi.waitFor(() => expect(silent.requests).toHaveLength(1));
    controller.abort(new Error('caller gave up'));
    expect(await pending).toEqual(new Error('caller gave up'));
  });
});

describe('isSpecialUseAddress', () => {
  it.each([
    '0.0.0.0', '0.1.2.3', '10.0.0.1', '10.255.255.255', '100.64.0.1', '100.127.255.254', '127.0.0.1', '127.255.0.1',
    '169.254.169.254', '172.16.0.1', '172.31.255.255', '192.0.0.8', '192.0.2.1', '192.88.99.1', '192.168.1.1',
    '198.18.0.1', '198.19.255.255', '198.51.100.7', '203.0.113.9', '224.0.0.1', '239.255.255.250', '240.0.0.1',
    '255.255.255.255',
    '::', '::1', '::ffff:127.0.0.1', '::ffff:7f00:1', '0:0:0:0:0:ffff:a00:1', '::ffff:169.254.169.254', '::127.0.0.1',
    '64:ff9b::808:808', '100::1', '2001::1', '2001:1ff:ffff::1', '2001:db8::1', '2002:7f00:1::1', 'fc00::1',
    'fd12:3456::1', 'fe80::1', 'febf::1', 'ff02::1',
    // Local-use NAT64 (64:ff9b:1::/48, RFC 8215), deprecated site-local (fec0::/10, RFC 3879),
    // IPv4-translated (::ffff:0:0:0/96, RFC 2765: a spelling of an IPv4 address the mapped check does not read).
    '64:ff9b:1::a00:1', '64:ff9b:1:ffff:ffff:ffff:ffff:ffff', 'fec0::1', 'feff:ffff::1', '::ffff:0:a00:1', '::ffff:0:808:808', '0:0:0:0:ffff:0:7f00:1',
    'not-an-ip', '', '010.0.0.1',
  ])('%s is special-use', (address) => {
    expect(isSpecialUseAddress(address, [])).toBe(true);
  });

  it.each(['8.8.8.8', '1.1.1.1', '100.63.255.255', '100.128.0.0', '172.15.255.255', '172.32.0.0', '192.0.1.1', '198.20.0.1', '223.255.255.255',
    '2606:4700::1111', '2001:4860:4860::8888', '2001:200::1', '::ffff:8.8.8.8',
    // Just outside the ranges above: 64:ff9b:2::/48 is neither NAT64 prefix, ::ffff:1:0:0/96 not the translated one.
    '64:ff9b:2::1', '::ffff:1:808:808'])('%s is public', (address) => {
    expect(isSpecialUseAddress(address, [])).toBe(false);
  });

  it('exempts the allowed networks, for mapped addresses too', () => {
    const allowed = ['10.1.0.0/16', 'fd00::/8', '127.0.0.1'];
    expect(isSpecialUseAddress('10.1.2.3', allowed)).toBe(false);
    expect(isSpecialUseAddress('10.2.0.1', allowed)).toBe(true);
    expect(isSpecialUseAddress('fd00::5', allowed)).toBe(false);
    expect(isSpecialUseAddress('fc00::5', allowed)).toBe(true);
    expect(isSpecialUseAddress('127.0.0.1', allowed)).toBe(false);
    expect(isSpecialUseAddress('127.0.0.2', allowed)).toBe(true);
    expect(isSpecialUseAddress('::ffff:10.1.2.3', allowed)).toBe(false);
    const list = new BlockList();
    list.addSubnet('169.254.0.0', 16, 'ipv4');
    expect(isSpecialUseAddress('169.254.169.254', list)).toBe(false);
  });

  it.each(['10.0.0.0/33', '10.0.0.0/', 'fd00::/129', 'example.com/8', '10.0.0.0/8/8'])('rejects the malformed network %j', (network) => {
    expect(() => isSpecialUseAddress('8.8.8.8', [network])).toThrow(/CIDR/);
    expect(() => createOutboundFetch({ ...LOOPBACK, allowedNetworks: [network] })).toThrow(/CIDR/);
  });
});
