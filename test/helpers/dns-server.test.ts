/** The test DNS server answers node's own resolver (c-ares) the way orgauth will ask it. */
import { promises as dns } from 'node:dns';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startDnsServer, type TestDnsServer } from './dns-server.js';

let server: TestDnsServer;
let resolver: dns.Resolver;

beforeAll(async () => {
  server = await startDnsServer();
  // One try and a short timeout: a lost answer must fail the test, not hang it for the default 5 s x 4.
  resolver = new dns.Resolver({ timeout: 1000, tries: 1 });
  resolver.setServers([server.address]);
});
afterAll(() => server.close());

describe('test DNS server', () => {
  it('listens on loopback with an ephemeral port, in the form setServers takes', () => {
    expect(server.address).toMatch(/^127\.0\.0\.1:\d+$/);
    expect(server.address).toBe(`127.0.0.1:${server.port}`);
  });

  it('answers TXT questions with the values set, one record each', async () => {
    server.setTxt('_orgauth-challenge.example.com', ['orgauth-verification=abc123', 'v=spf1 -all']);
    const records = await resolver.resolveTxt('_orgauth-challenge.example.com');
    expect(records.map((chunks) => chunks.join(''))).toEqual(['orgauth-verification=abc123', 'v=spf1 -all']);
    expect(server.queries()).toContain('_orgauth-challenge.example.com');
  });

  it('matches names case-insensitively and takes a trailing dot', async () => {
    server.setTxt('_orgauth-challenge.Mixed.Example.ORG.', ['token']);
    expect(await resolver.resolveTxt('_ORGAUTH-challenge.mixed.example.org')).toEqual([['token']]);
  });

  it('rejects an unknown name with ENOTFOUND (NXDOMAIN)', async () => {
    await expect(resolver.resolveTxt('_orgauth-challenge.unknown.example')).rejects.toMatchObject({ code: 'ENOTFOUND' });
  });

  it('rejects with ENODATA a name that exists without TXT records, or asked for another type', async () => {
    server.setTxt('_orgauth-challenge.empty.example', []);
    await expect(resolver.resolveTxt('_orgauth-challenge.empty.example')).rejects.toMatchObject({ code: 'ENODATA' });
    server.setTxt('_orgauth-challenge.typed.example', ['x']);
    await expect(resolver.resolve4('_orgauth-challenge.typed.example')).rejects.toMatchObject({ code: 'ENODATA' });
  });

  it('forgets a cleared name, and setTxt replaces the values', async () => {
    server.setTxt('_orgauth-challenge.change.example', ['first']);
    server.setTxt('_orgauth-challenge.change.example', ['second']);
    expect(await resolver.resolveTxt('_orgauth-challenge.change.example')).toEqual([['second']]);
    server.clear('_orgauth-challenge.change.example');
    await expect(resolver.resolveTxt('_orgauth-challenge.change.example')).rejects.toMatchObject({ code: 'ENOTFOUND' });
  });

  it('splits a value over 255 bytes into character-strings of one record', async () => {
    const long = 'a'.repeat(300);
    server.setTxt('_orgauth-challenge.long.example', [long]);
    const [record] = await resolver.resolveTxt('_orgauth-challenge.long.example');
    expect(record?.map((chunk) => chunk.length)).toEqual([255, 45]);
    expect(record?.join('')).toBe(long);
    // Never inside a UTF-8 sequence: 200 two-byte characters make pieces of 254 and 146 bytes.
    // (node hands TXT bytes back one character per byte, latin1, not decoded as UTF-8.)
    const accented = 'é'.repeat(200);
    server.setTxt('_orgauth-challenge.utf8.example', [accented]);
    const [utf8] = await resolver.resolveTxt('_orgauth-challenge.utf8.example');
    expect(utf8?.map((chunk) => chunk.length)).toEqual([254, 146]);
    expect(Buffer.from(utf8?.join('') ?? '', 'latin1').toString('utf8')).toBe(accented);
  });

  it('serves an answer too large for UDP over TCP on the same port', async () => {
    // 20 records of 100 bytes: far over 512 bytes, so the UDP answer is truncated and c-ares retries over TCP.
    const values = Array.from({ length: 20 }, (_, i) => `${String(i).padStart(2, '0')}-${'x'.repeat(97)}`);
    server.setTxt('_orgauth-challenge.big.example', values);
    const records = await resolver.resolveTxt('_orgauth-challenge.big.example');
    expect(records.map((chunks) => chunks.join('')).sort()).toEqual(values);
  });
});
