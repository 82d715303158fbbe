/**
 * The official MCP TypeScript SDK's client, through its own `auth()` flow and Streamable HTTP
 * transport, against the example MCP server (examples/mcp-server) behind orgauth, both listening
 * on loopback: 401 → the server's RFC 9728 document → orgauth's metadata → dynamic registration →
 * authorization with PKCE and `resource` → sign-in and consent, choosing an organization → a
 * token whose `aud` is the MCP server → tool calls answered for that organization only. Then
 * RFC 8707 both ways: the MCP token is refused by orgauth's API, an API token by the MCP server.
 */
import { randomBytes } from 'node:crypto';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { type OAuthClientProvider, UnauthorizedError } from '@modelcontextprotocol/sdk/client/auth.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { OAuthClientInformationMixed, OAuthClientMetadata, OAuthTokens } from '@modelcontextprotocol/sdk/shared/auth.js';
import type { FetchLike } from '@modelcontextprotocol/sdk/shared/transport.js';
import { decodeJwt } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember, createOrganization } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { createResource } from '../../src/oauth/models/resources.js';
import { type RunningMcpServer, startMcpServer } from '../../examples/mcp-server/server.js';
import { approveConsent, signInFor } from '../helpers/consent.js';
import { clientCredentialsToken } from '../helpers/oauth.js';
import { type OidcWorld, startOidcWorld } from '../helpers/oidc-world.js';
import { freePort } from '../helpers/process.js';

const PASSWORD = 'mcp-user-password-1';

let world: OidcWorld;
let mcp: RunningMcpServer;
/** Where the SDK client says it is called back; nothing listens there: the test reads the code off orgauth's 303. */
let redirectUri: string;
let user: { id: number; email: string };
/** The user owns the first, is a member of the second and a viewer in the third. */
const orgs = { first: 0, second: 0, third: 0 };

/** Every request the SDK client makes, as `METHOD where path status` (where: mcp or orgauth). */
const requests: string[] = [];
const recordingFetch: FetchLike = async (url, init) => {
  const res = await fetch(url, init);
  const target = new URL(url);
  const where = target.origin === new URL(mcp.resource).origin ? 'mcp' : target.origin === world.issuer ? 'orgauth' : target.origin;
  requests.push(`${init?.method ?? 'GET'} ${where} ${target.pathname} ${res.status}`);
  return res;
};

/**
 * The SDK's OAuthClientProvider, kept in memory; the browser part (redirectToAuthorization) is a
 * person signing in and choosing `organizationId` on the consent page, over HTTP.
 */
class AgentProvider implements OAuthClientProvider {
  private client: OAuthClientInformationMixed | undefined;
  private saved: OAuthTokens | undefined;
  private verifier: string | undefined;
  readonly states: string[] = [];
  authorizationUrl: URL | undefined;
  /** orgauth's redirect back to the client, with the code. */
  callback: URL | undefined;

  constructor(
    readonly redirectUrl: string,
    private readonly organizationId: number,
  ) {}

  get clientMetadata(): OAuthClientMetadata {
    return {
      client_name: 'MCP SDK test agent',
      redirect_uris: [this.redirectUrl],
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      token_endpoint_auth_method: 'none',
    };
  }

  /** The contract asks for a state of at least 16 characters; the SDK sends one only when the provider makes it. */
  state(): string {
    const state = randomBytes(24).toString('base64url');
    this.states.push(state);
    return state;
  }

  clientInformation() {
    return this.client;
  }

  saveClientInformation(info: OAuthClientInformationMixed): void {
    this.client = info;
  }

  tokens() {
    return this.saved;
  }

  saveTokens(tokens: OAuthTokens): void {
    this.saved = tokens;
  }

  saveCodeVerifier(verifier: string): void {
    this.verifier = verifier;
  }

  codeVerifier(): string {
    if (this.verifier === undefined) throw new Error('no code verifier saved');
    return this.verifier;
  }

  async redirectToAuthorization(url: URL): Promise<void> {
    this.authorizationUrl = url;
    this.callback = await signInAndConsent(url, this.organizationId);
  }

  /** The code from the callback, once its state is the one sent. */
  code(): string {
    expect(this.callback?.searchParams.get('state')).toBe(this.states.at(-1));
    const code = this.callback?.searchParams.get('code');
    if (!code) throw new Error(`no code in ${this.callback}`);
    return code;
  }

  accessToken(): string {
    if (!this.saved) throw new Error('no tokens');
    return this.saved.access_token;
  }
}

/** A person in a browser: the authorization URL, the email-first sign-in, the consent page; returns orgauth's redirect to the client. */
async function signInAndConsent(authorizationUrl: URL, organizationId: number): Promise<URL> {
  const { browser, page } = await signInFor(authorizationUrl, { issuer: world.issuer, email: user.email, password: PASSWORD });
  expect(page.status).toBe(200);
  const consent = await page.text();
  expect(consent).toContain('MCP SDK test agent');
  // A client nobody registered is marked as such, and the page names the resource the access is for.
  expect(consent).toContain('class="warning unverified"');
  expect(consent).toContain(`<strong>Contacts MCP</strong> (<code>${mcp.resource}</code>)`);
  // The organization choice: all three of the user's organizations are offered.
  for (const id of Object.values(orgs)) expect(consent).toContain(`name="organization_id" value="${id}"`);
  const callback = await approveConsent(browser, world.issuer, consent, organizationId);
  expect(callback.origin + callback.pathname).toBe(redirectUri);
  // RFC 9207: the response names its issuer.
  expect(callback.searchParams.get('iss')).toBe(world.issuer);
  return callback;
}

/** Connects the SDK client as an agent would: the first connection sends the user to authorize, the second uses the token. */
async function connectAgent(provider: AgentProvider): Promise<Client> {
  const first = new StreamableHTTPClientTransport(new URL(mcp.resource), { authProvider: provider, fetch: recordingFetch });
  await expect(new Client({ name: 'test-agent', version: '1.0.0' }).connect(first)).rejects.toThrow(UnauthorizedError);
  await first.finishAuth(provider.code());
  const client = new Client({ name: 'test-agent', version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(new URL(mcp.resource), { authProvider: provider, fetch: recordingFetch }));
  return client;
}

/** One JSON-RPC tools/call over plain HTTP, as any client could send it. */
function callToolOverHttp(token: string | undefined, name: string, args: Record<string, unknown> = {}, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(mcp.resource, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      ...(token === undefined ? {} : { authorization: `Bearer ${token}` }),
      ...headers,
    },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name, arguments: args } }),
  });
}

/** A tool result's structuredContent (MCP 2025-06-18), which the example's tools always send. */
const contactsOf = (result: object): unknown => ('structuredContent' in result ? result.structuredContent : undefined);

beforeAll(async () => {
  world = await startOidcWorld();
  const db = world.t.handle.db;
  const created = await createUser(db, { email: `mcp-${process.pid}-${Date.now()}@example.com`, password: PASSWORD, name: 'Ada Agent' });
  user = { id: created.id, email: created.email };
  const other = await createUser(db, { email: `mcp-owner-${process.pid}-${Date.now()}@example.com`, password: PASSWORD });
  orgs.first = (await createOrganization(db, { name: 'Northwind', ownerUserId: user.id })).id;
  orgs.second = (await createOrganization(db, { name: 'Contoso', ownerUserId: other.id })).id;
  orgs.third = (await createOrganization(db, { name: 'Fabrikam', ownerUserId: other.id })).id;
  await addMember(db, { organizationId: orgs.second, userId: user.id, role: 'member' });
  await addMember(db, { organizationId: orgs.third, userId: user.id, role: 'viewer' });

  const mcpPort = await freePort();
  const resourceUri = `http://127.0.0.1:${mcpPort}/mcp`;
  // What `orgauth resource create --uri ... --name "Contacts MCP" --scopes "contacts.read contacts.write"` does.
  await createResource(db, world.config, { uri: resourceUri, name: 'Contacts MCP', scopes: 'contacts.read contacts.write' });
  mcp = await startMcpServer({
    issuer: world.issuer,
    resourceUri,
    port: mcpPort,
    contacts: [
      { organizationId: orgs.first, name: 'Nancy Davolio', email: 'nancy@northwind.example' },
      { organizationId: orgs.second, name: 'Carla Contoso', email: 'carla@contoso.example' },
      { organizationId: orgs.third, name: 'Fritz Fabrikam', email: 'fritz@fabrikam.example' },
    ],
  });
  redirectUri = `http://127.0.0.1:${await freePort()}/callback`;
}, 60_000);

afterAll(async () => {
  await mcp?.close();
  await world?.close();
});

describe('the example MCP server', () => {
  it('describes itself per RFC 9728, at the path-suffixed location and the bare one', async () => {
    expect(mcp.resourceMetadataUrl).toBe(`${new URL(mcp.resource).origin}/.well-known/oauth-protected-resource/mcp`);
    const expected = {
      resource: mcp.resource,
      authorization_servers: [world.issuer],
      scopes_supported: ['contacts.read', 'contacts.write'],
      bearer_methods_supported: ['header'],
      resource_name: expect.any(String),
    };
    for (const url of [mcp.resourceMetadataUrl, `${new URL(mcp.resource).origin}/.well-known/oauth-protected-resource`]) {
      const res = await fetch(url);
      expect(res.status).toBe(200);
      expect(await res.json()).toEqual(expected);
    }
  });

  it('answers a request without a token 401 with only resource_metadata (RFC 6750 §3.1)', async () => {
    const res = await callToolOverHttp(undefined, 'list_contacts');
    expect(res.status).toBe(401);
    expect(res.headers.get('www-authenticate')).toBe(`Bearer resource_metadata="${mcp.resourceMetadataUrl}"`);
  });
});

describe('the MCP SDK client through orgauth', () => {
  let memberToken: string;

  it('connects: 401 → resource metadata → orgauth metadata → registration → authorize with PKCE and resource → consent → token for the chosen organization', async () => {
    requests.length = 0;
    const provider = new AgentProvider(redirectUri, orgs.second);
    const first = new StreamableHTTPClientTransport(new URL(mcp.resource), { authProvider: provider, fetch: recordingFetch });
    await expect(new Client({ name: 'test-agent', version: '1.0.0' }).connect(first)).rejects.toThrow(UnauthorizedError);
    expect(requests).toEqual([
      'POST mcp /mcp 401',
      'GET mcp /.well-known/oauth-protected-resource/mcp 200',
      'GET orgauth /.well-known/oauth-authorization-server 200',
      'POST orgauth /oauth/register 201',
    ]);
    const registered = provider.clientInformation();
    expect(registered?.client_id).toEqual(expect.any(String));

    // The authorization request the SDK built: PKCE S256, the MCP server as resource, its scopes.
    const asked = provider.authorizationUrl!;
    expect(asked.origin + asked.pathname).toBe(`${world.issuer}/oauth/authorize`);
    expect(Object.fromEntries(asked.searchParams)).toEqual({
      response_type: 'code',
      client_id: registered!.client_id,
      code_challenge: expect.stringMatching(/^[A-Za-z0-9_-]{43}$/),
      code_challenge_method: 'S256',
      redirect_uri: redirectUri,
      state: provider.states[0],
      scope: 'contacts.read contacts.write',
      resource: mcp.resource,
    });

    requests.length = 0;
    await first.finishAuth(provider.code());
    expect(requests.at(-1)).toBe('POST orgauth /oauth/token 200');
    memberToken = provider.accessToken();
    expect(decodeJwt(memberToken)).toMatchObject({
      iss: world.issuer,
      aud: mcp.resource,
      sub: String(user.id),
      client_id: registered!.client_id,
      organization_id: orgs.second,
      scope: 'contacts.read contacts.write',
    });

    const client = new Client({ name: 'test-agent', version: '1.0.0' });
    await client.connect(new StreamableHTTPClientTransport(new URL(mcp.resource), { authProvider: provider, fetch: recordingFetch }));
    try {
      expect((await client.listTools()).tools.map((t) => t.name).sort()).toEqual(['create_contact', 'list_contacts', 'search_contacts']);
      // The chosen organization's contacts, and only those.
      expect(contactsOf(await client.callTool({ name: 'list_contacts' }))).toEqual({
        organization_id: orgs.second,
        contacts: [{ id: expect.any(Number), name: 'Carla Contoso', email: 'carla@contoso.example' }],
      });
      expect(contactsOf(await client.callTool({ name: 'search_contacts', arguments: { query: 'nancy' } }))).toEqual({ organization_id: orgs.second, contacts: [] });
      const created = contactsOf(await client.callTool({ name: 'create_contact', arguments: { name: 'Cody Contoso', email: 'cody@contoso.example' } }));
      expect(created).toEqual({ organization_id: orgs.second, contact: { id: expect.any(Number), name: 'Cody Contoso', email: 'cody@contoso.example' } });
      expect(contactsOf(await client.callTool({ name: 'search_contacts', arguments: { query: 'CODY' } }))).toEqual({
        organization_id: orgs.second,
        contacts: [{ id: expect.any(Number), name: 'Cody Contoso', email: 'cody@contoso.example' }],
      });
      // Nothing reached the other organizations.
      expect(mcp.store.list(orgs.first).map((c) => c.name)).toEqual(['Nancy Davolio']);
      expect(mcp.store.list(orgs.third).map((c) => c.name)).toEqual(['Fritz Fabrikam']);
    } finally {
      await client.close();
    }
  });

  it('the MCP server’s token is refused by orgauth’s API (RFC 8707)', async () => {
    const mcpAnswer = await callToolOverHttp(memberToken, 'list_contacts');
    expect(mcpAnswer.status).toBe(200);
    const res = await fetch(`${world.issuer}/api/v1/${orgs.second}/contacts`, { headers: { authorization: `Bearer ${memberToken}`, accept: 'application/json' } });
    expect(res.status).toBe(401);
    expect(await res.json()).toEqual({ error: 'invalid_token', error_description: expect.any(String) });
  });

  it('the MCP server refuses a good token sent from a web page of another origin (DNS rebinding)', async () => {
    expect((await callToolOverHttp(memberToken, 'list_contacts', {}, { origin: new URL(mcp.resource).origin })).status).toBe(200);
    const res = await callToolOverHttp(memberToken, 'list_contacts', {}, { origin: 'http://attacker.example' });
    expect(res.status).toBe(403);
    expect(await res.json()).toEqual({ error: 'forbidden', error_description: expect.any(String) });
  });

  it('an access token for orgauth’s API is refused by the MCP server', async () => {
    const apiToken = await clientCredentialsToken(world.app, world.org);
    expect(decodeJwt(apiToken).aud).toBe(`${world.issuer}/api/v1`);
    const api = await fetch(`${world.issuer}/api/v1/${world.org.organizationId}/contacts`, { headers: { authorization: `Bearer ${apiToken}`, accept: 'application/json' } });
    expect(api.status).toBe(200);
    const res = await callToolOverHttp(apiToken, 'list_contacts');
    expect(res.status).toBe(401);
    expect(res.headers.get('www-authenticate')).toMatch(new RegExp(`^Bearer error="invalid_token", error_description="[^"]+", resource_metadata="${mcp.resourceMetadataUrl}"$`));
    expect(await res.json()).toEqual({ error: 'invalid_token', error_description: expect.any(String) });
  });

  it('a viewer’s token reads but gets 403 insufficient_scope, with the scope to ask for, on create_contact', async () => {
    const provider = new AgentProvider(redirectUri, orgs.third);
    const client = await connectAgent(provider);
    try {
      const token = provider.accessToken();
      // The viewer role holds contacts.read, not contacts.write: orgauth granted only the former.
      expect(decodeJwt(token)).toMatchObject({ aud: mcp.resource, organization_id: orgs.third, scope: 'contacts.read' });
      expect(contactsOf(await client.callTool({ name: 'list_contacts' }))).toEqual({
        organization_id: orgs.third,
        contacts: [{ id: expect.any(Number), name: 'Fritz Fabrikam', email: 'fritz@fabrikam.example' }],
      });
      const res = await callToolOverHttp(token, 'create_contact', { name: 'Mallory' });
      expect(res.status).toBe(403);
      expect(res.headers.get('www-authenticate')).toBe(
        `Bearer error="insufficient_scope", error_description="this call needs contacts.write", scope="contacts.read contacts.write", resource_metadata="${mcp.resourceMetadataUrl}"`,
      );
      // The SDK client steps up: it refreshes for the scope named, and the role still says no.
      requests.length = 0;
      await expect(client.callTool({ name: 'create_contact', arguments: { name: 'Mallory' } })).rejects.toThrow('Server returned 403 after trying upscoping');
      expect(requests.filter((r) => r.includes('/oauth/token') || r.includes(' /mcp '))).toEqual(['POST mcp /mcp 403', 'POST orgauth /oauth/token 200', 'POST mcp /mcp 403']);
      // The refreshed token is still for this server and this organization (a refresh keeps the audience).
      expect(provider.accessToken()).not.toBe(token);
      expect(decodeJwt(provider.accessToken())).toMatchObject({ aud: mcp.resource, organization_id: orgs.third, scope: 'contacts.read' });
      expect(mcp.store.list(orgs.third).map((c) => c.name)).toEqual(['Fritz Fabrikam']);
    } finally {
      await client.close();
    }
  });
});
