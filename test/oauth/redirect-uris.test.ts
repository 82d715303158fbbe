import { describe, expect, it } from 'vitest';
import { redirectUriProblem } from '../../src/oauth/helpers/redirect-uris.js';
import { parseScopes } from '../../src/oauth/helpers/scopes.js';

describe('registering a redirect URI (AZ-10)', () => {
  it.each([
    'https://app.example.com/callback',
    'https://app.example.com/callback?tenant=1',
    'https://app.example.com:8443/cb',
    'http://localhost:8080/callback',
    'http://127.0.0.1:9000/cb',
    'http://[::1]:9000/cb',
  ])('accepts %s', (uri) => {
    expect(redirectUriProblem(uri)).toBeNull();
  });

  it.each([
    ['/callback', 'must be an absolute URL'],
    ['app.example.com/callback', 'must be an absolute URL'],
    ['https://app.example.com/cb#frag', 'must not contain a fragment'],
    ['https://app.example.com/cb#', 'must not contain a fragment'],
    ['https://user:pw@app.example.com/cb', 'must not contain user info'],
    ['https://user@app.example.com/cb', 'must not contain user info'],
    ['http://app.example.com/cb', 'http is allowed only for loopback hosts (localhost, 127.0.0.1, [::1]); use https'],
    ['http://localhost.evil.com/cb', 'http is allowed only for loopback hosts (localhost, 127.0.0.1, [::1]); use https'],
    ['javascript:alert(1)', 'must use https (or http for a loopback host)'],
    ['custom-scheme://cb', 'must use https (or http for a loopback host)'],
    ['https://app.example.com/c b', 'must not contain spaces or control characters'],
    ['https://app.example.com/\u0000', 'must not contain spaces or control characters'],
    [`https://app.example.com/${'a'.repeat(2000)}`, 'must be at most 2000 characters'],
  ])('refuses %s', (uri, problem) => {
    expect(redirectUriProblem(uri)).toBe(problem);
  });
});

describe('parseScopes', () => {
  it('splits on spaces, de-duplicates and orders canonically', () => {
    expect(parseScopes('tasks.write contacts.read  tasks.write')).toEqual(['contacts.read', 'tasks.write']);
    expect(parseScopes(['tasks.read', 'contacts.write tasks.read'])).toEqual(['contacts.write', 'tasks.read']);
    expect(parseScopes('')).toEqual([]);
  });

  it('names unknown scopes', () => {
    expect(() => parseScopes('contacts.read admin __proto__')).toThrow(/unknown scope "admin", "__proto__"/);
  });
});
