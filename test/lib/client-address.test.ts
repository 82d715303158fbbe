/** src/lib/client-address.ts: which address a request counts as, and the key it is counted under. */
import { describe, expect, it } from 'vitest';
import { addressGroup, clientAddress } from '../../src/lib/client-address.js';

describe('addressGroup', () => {
  it.each([
    ['203.0.113.9', '203.0.113.9'],
    // IPv4-mapped, as a dual-stack listener reports IPv4 clients, in either spelling: the IPv4 address.
    ['::ffff:203.0.113.9', '203.0.113.9'],
    ['::FFFF:cb00:7109', '203.0.113.9'],
    // An IPv6 address: its /64, however it is written.
    ['2001:db8:1:2::1', '2001:db8:1:2::/64'],
    ['2001:DB8:1:2:aaaa:bbbb:cccc:dddd', '2001:db8:1:2::/64'],
    ['2001:0db8:0001:0002:0000:0000:0000:0001', '2001:db8:1:2::/64'],
    ['2001:db8::1', '2001:db8:0:0::/64'],
    ['fe80::1%eth0', 'fe80:0:0:0::/64'],
    ['64:ff9b::192.0.2.1', '64:ff9b:0:0::/64'],
    ['::1', '0:0:0:0::/64'],
    ['::', '0:0:0:0::/64'],
  ])('%s → %s', (ip, group) => {
    expect(addressGroup(ip)).toBe(group);
  });
});

describe('clientAddress', () => {
  const request = (ip: string, remoteAddress: string | undefined) => ({ ip, socket: { remoteAddress } }) as Parameters<typeof clientAddress>[0];

  it('is req.ip when it is an IP address (what a trusted proxy forwarded)', () => {
    expect(clientAddress(request('198.51.100.7', '10.0.0.1'))).toBe('198.51.100.7');
    expect(clientAddress(request('2001:db8::7', '10.0.0.1'))).toBe('2001:db8::7');
  });

  it('is the connection’s address when req.ip is not an address (a forged X-Forwarded-For)', () => {
    for (const forged of ['zz:zz', 'not an address', '', '1.2.3.4.5', "1.1.1.1'; drop table x"]) {
      expect(clientAddress(request(forged, '10.0.0.1'))).toBe('10.0.0.1');
    }
    // A closed connection has none: one shared key, never the forged value.
    expect(clientAddress(request('zz:zz', undefined))).toBe('0.0.0.0');
  });
});
