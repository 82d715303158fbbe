/**
 * The demo data a fresh embedded database gets on first start (and `orgauth seed-demo` on
 * request): a user, an organization they own, a public and a private application. Passwords and
 * secrets are random and shown once.
 */
import { createOrganization } from './accounts/organizations.js';
import { insertUser, prepareUser, type PublicUser } from './accounts/users.js';
import { type DB, inTransaction } from './db/connect.js';
import { generateSecret } from './lib/crypto.js';
import { type ApplicationWithSecret, createApplication } from './oauth/models/applications.js';
import { isManagementScope, KNOWN_SCOPES } from './oauth/helpers/scopes.js';

export const DEMO_EMAIL = 'demo@orgauth.local';
export const DEMO_REDIRECT_URI = 'http://localhost:8080/callback';

export interface DemoSeed {
  user: PublicUser & { password: string };
  organization: { id: number; name: string };
  public_application: ApplicationWithSecret;
  private_application: ApplicationWithSecret;
}

/** Whether the database holds no users and no organizations yet. */
export async function isDatabaseEmpty(db: DB): Promise<boolean> {
  const [user, org] = await Promise.all([
    db.selectFrom('users').select('id').limit(1).executeTakeFirst(),
    db.selectFrom('organizations').select('id').limit(1).executeTakeFirst(),
  ]);
  return user === undefined && org === undefined;
}

/** The steps of seedDemo, as its onProgress tells them. */
export const DEMO_SEED_STEPS = [
  'hashing the password',
  'creating the user',
  'creating the organization',
  'creating the public application',
  'creating the private application',
] as const;

/**
 * Seeds the demo in one transaction. Fails with ConflictError when the demo user exists.
 * `onProgress` is told as each step starts: its number (1-based) and what it does.
 */
export async function seedDemo(db: DB, options: { onProgress?: (step: number, of: number, what: string) => void } = {}): Promise<DemoSeed> {
  const step = (n: number) => options.onProgress?.(n, DEMO_SEED_STEPS.length, DEMO_SEED_STEPS[n - 1]!);
  const password = generateSecret(12);
  step(1);
  const prepared = await prepareUser({ email: DEMO_EMAIL, password, name: 'Demo User' });
  return inTransaction(db, async (trx) => {
    step(2);
    const user = await insertUser(trx, { ...prepared, emailVerified: true });
    step(3);
    const organization = await createOrganization(trx, { name: 'Demo Organization', ownerUserId: user.id });
    step(4);
    const public_application = await createApplication(trx, {
      organizationId: organization.id,
      type: 'public',
      name: 'Demo Public App',
      redirectUris: [DEMO_REDIRECT_URI],
      actor: { actorUserId: user.id },
    });
    step(5);
    const private_application = await createApplication(trx, {
      organizationId: organization.id,
      type: 'private',
      name: 'Demo Integration',
      // The data scopes and the management API, so the banner can show both.
      scopes: [...KNOWN_SCOPES],
      actor: { actorUserId: user.id },
    });
    return { user: { ...user, password }, organization, public_application, private_application };
  });
}

/**
 * The text printed once after seeding: logins, credentials, a curl that gets a token for the
 * organization's data and one that lists its applications through the management API.
 */
export function formatDemoBanner(seed: DemoSeed, issuer: string): string {
  const pub = seed.public_application;
  const priv = seed.private_application;
  const orgId = seed.organization.id;
  const line = '─'.repeat(72);
  return [
    line,
    ' orgauth demo data (shown once: secrets are stored only as hashes)',
    line,
    ` Log in at ${issuer}/login`,
    `   email:    ${seed.user.email}`,
    `   password: ${seed.user.password}`,
    ` Organization "${seed.organization.name}", organization_id ${seed.organization.id}`,
    '',
    ` Public application "${pub.name}" (authorization code)`,
    `   client_id:     ${pub.client_id}`,
    `   client_secret: ${pub.client_secret}`,
    `   redirect_uri:  ${pub.redirect_uris.join(' ')}`,
    '',
    ` Private application "${priv.name}" (client_credentials)`,
    `   client_id:     ${priv.client_id}`,
    `   client_secret: ${priv.client_secret}`,
    '',
    ' Get an access token for the organization:',
    `   curl -s -u '${priv.client_id}:${priv.client_secret}' \\`,
    `     -d grant_type=client_credentials -d organization_id=${orgId} \\`,
    `     --data-urlencode 'scope=${priv.scopes.filter((s) => !isManagementScope(s)).join(' ')}' \\`,
    `     ${issuer}/oauth/token`,
    '',
    " List the organization's applications with a management token:",
    `   TOKEN=$(curl -s -u '${priv.client_id}:${priv.client_secret}' \\`,
    `     -d grant_type=client_credentials -d organization_id=${orgId} -d scope=applications.read \\`,
    `     ${issuer}/oauth/token | sed -E 's/.*"access_token":"([^"]+)".*/\\1/')`,
    `   curl -s -H "Authorization: Bearer $TOKEN" ${issuer}/api/v1/${orgId}/applications`,
    '',
    ' Administer from another terminal while the server runs: npx orgauth --help',
    line,
  ].join('\n');
}
