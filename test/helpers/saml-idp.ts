/**
 * A SAML 2.0 identity provider for the tests, in two forms:
 *
 * (a) createSamlIdp(): samlify (an independent SAML implementation) as the organization's IdP. It
 *     reads the AuthnRequest orgauth's SP (node-saml) sends by HTTP-Redirect and answers with a
 *     signed HTTP-POST SAMLResponse, so the happy path is exercised against someone else's idea
 *     of SAML, not against our own templates.
 *
 * (b) A response forge: the same response built from string templates and signed with xml-crypto
 *     directly, every field overridable, plus the classic attacks (unsigned, signed by another key,
 *     edited after signing, signature wrapping, comment in the NameID), each returned as the
 *     base64 SAMLResponse an attacker would POST to the ACS.
 *
 * Keys: an RSA key and a self-signed X.509 certificate for the IdP, another pair for the attacker,
 * generated once per test process (RSA key generation is the slow part). The certificate is
 * built here (a minimal DER writer, signed with node:crypto), so no certificate package or
 * openssl binary is needed; node:crypto's X509Certificate parses and verifies it.
 */
import { createHash, generateKeyPairSync, type KeyObject, randomBytes, sign as signData, X509Certificate } from 'node:crypto';
import { inflateRawSync } from 'node:zlib';
import { Constants, IdentityProvider, ServiceProvider, setSchemaValidator } from 'samlify';
import { SignedXml } from 'xml-crypto';

// ---------------------------------------------------------------------------------------------
// Keys and certificates

export interface TestKeyPair {
  privateKeyPem: string;
  certificatePem: string;
}

/** DER TLV with definite length (X.690 §8.1). */
function der(tag: number, ...contents: Buffer[]): Buffer {
  const body = Buffer.concat(contents);
  let length: Buffer;
  if (body.length < 0x80) length = Buffer.from([body.length]);
  else {
    const hex = body.length.toString(16);
    const bytes = Buffer.from(hex.length % 2 ? `0${hex}` : hex, 'hex');
    length = Buffer.concat([Buffer.from([0x80 | bytes.length]), bytes]);
  }
  return Buffer.concat([Buffer.from([tag]), length, body]);
}
const derSequence = (...c: Buffer[]) => der(0x30, ...c);
const derSet = (...c: Buffer[]) => der(0x31, ...c);
const derPositiveInteger = (b: Buffer) => der(0x02, (b[0] ?? 0) & 0x80 ? Buffer.concat([Buffer.from([0]), b]) : b);
const derUtf8 = (s: string) => der(0x0c, Buffer.from(s, 'utf8'));
const derNull = Buffer.from([0x05, 0x00]);
function derOid(dotted: string): Buffer {
  const [a = 0, b = 0, ...rest] = dotted.split('.').map(Number);
  const bytes = [40 * a + b];
  for (const n of rest) {
    const base128 = [n & 0x7f];
    for (let v = n >>> 7; v > 0; v >>>= 7) base128.unshift((v & 0x7f) | 0x80);
    bytes.push(...base128);
  }
  return der(0x06, Buffer.from(bytes));
}
/** UTCTime YYMMDDHHMMSSZ (RFC 5280 §4.1.2.5.1: for years before 2050). */
const derUtcTime = (d: Date) => der(0x17, Buffer.from(d.toISOString().replace(/[-:T]/g, '').slice(2, 14) + 'Z'));

/**
 * A self-signed RSA/SHA-256 X.509 v3 certificate for `key` (RFC 5280 §4.1), valid from a day
 * ago for a year. SAML peers only use the certificate as a carrier of the public key, so it has
 * a subject CN and no extensions.
 */
function selfSignedCertificate(commonName: string, privateKey: KeyObject, publicKey: KeyObject): string {
  const sha256WithRsa = derSequence(derOid('1.2.840.113549.1.1.11'), derNull);
  const name = derSequence(derSet(derSequence(derOid('2.5.4.3'), derUtf8(commonName))));
  const serial = randomBytes(16);
  // Positive, and no leading zero byte (DER forbids a needless one): the top bit clear, the next set.
  serial[0] = ((serial[0] ?? 0) & 0x7f) | 0x40;
  const now = Date.now();
  const tbs = derSequence(
    der(0xa0, derPositiveInteger(Buffer.from([2]))), // [0] EXPLICIT version v3
    derPositiveInteger(serial),
    sha256WithRsa,
    name,
    derSequence(derUtcTime(new Date(now - 86_400_000)), derUtcTime(new Date(now + 365 * 86_400_000))),
    name,
    publicKey.export({ type: 'spki', format: 'der' }),
  );
  const signature = signData('sha256', tbs, privateKey);
  const certificate = derSequence(tbs, sha256WithRsa, der(0x03, Buffer.from([0]), signature));
  const pem = `-----BEGIN CERTIFICATE-----\n${certificate.toString('base64').match(/.{1,64}/g)?.join('\n')}\n-----END CERTIFICATE-----\n`;
  // Fail here, not deep inside a signature check, if the DER above is ever wrong.
  if (!new X509Certificate(pem).verify(publicKey)) throw new Error('self-signed certificate does not verify');
  return pem;
}

/** A fresh RSA-2048 key and its self-signed certificate (about 100 ms: prefer the cached pairs below). */
export function generateTestKeyPair(commonName: string): TestKeyPair {
  const { privateKey, publicKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  return {
    privateKeyPem: privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(),
    certificatePem: selfSignedCertificate(commonName, privateKey, publicKey),
  };
}

const cachedPairs = new Map<string, TestKeyPair>();
function cachedPair(name: string): TestKeyPair {
  let pair = cachedPairs.get(name);
  if (!pair) cachedPairs.set(name, (pair = generateTestKeyPair(name)));
  return pair;
}
/** The test IdP's signing key pair (one per process). */
export const idpKeyPair = (): TestKeyPair => cachedPair('orgauth test IdP');
/** The attacker's key pair: a valid certificate, just not the one the SP trusts. */
export const attackerKeyPair = (): TestKeyPair => cachedPair('attacker');

/** The base64 body of a PEM certificate, as it appears in metadata and KeyInfo. */
export const certificateBody = (pem: string): string => pem.replace(/-----(BEGIN|END) CERTIFICATE-----|\s/g, '');

// ---------------------------------------------------------------------------------------------
// Shared XML bits

export const NAMEID_FORMAT = {
  emailAddress: 'urn:oasis:names:tc:SAML:1.1:nameid-format:emailAddress',
  persistent: 'urn:oasis:names:tc:SAML:2.0:nameid-format:persistent',
  transient: 'urn:oasis:names:tc:SAML:2.0:nameid-format:transient',
  unspecified: 'urn:oasis:names:tc:SAML:1.1:nameid-format:unspecified',
} as const;

const NS_PROTOCOL = 'urn:oasis:names:tc:SAML:2.0:protocol';
const NS_ASSERTION = 'urn:oasis:names:tc:SAML:2.0:assertion';
const STATUS_SUCCESS = 'urn:oasis:names:tc:SAML:2.0:status:Success';
const AC_PASSWORD_PROTECTED = 'urn:oasis:names:tc:SAML:2.0:ac:classes:PasswordProtectedTransport';
const ATTRNAME_BASIC = 'urn:oasis:names:tc:SAML:2.0:attrname-format:basic';

export const DEFAULT_IDP_ENTITY_ID = 'https://idp.example.test/saml/metadata';
export const DEFAULT_IDP_SSO_URL = 'https://idp.example.test/saml/sso';

/** Escapes text and attribute values alike (quotes included). */
const xmlEscape = (s: string): string =>
  s.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&apos;' })[c] ?? c);

/** SAML IDs are xs:ID (NCName): they must not start with a digit, hence the underscore. */
const newId = (): string => `_${randomBytes(20).toString('hex')}`;

export const encodeSamlResponse = (xml: string): string => Buffer.from(xml, 'utf8').toString('base64');
export const decodeSamlResponse = (base64: string): string => Buffer.from(base64, 'base64').toString('utf8');

function attributeStatement(attributes: Record<string, string | string[]>): string {
  const entries = Object.entries(attributes);
  if (!entries.length) return '';
  const attrs = entries
    .map(([name, value]) => {
      const values = (Array.isArray(value) ? value : [value]).map((v) => `<saml:AttributeValue xsi:type="xs:string">${xmlEscape(v)}</saml:AttributeValue>`).join('');
      return `<saml:Attribute Name="${xmlEscape(name)}" NameFormat="${ATTRNAME_BASIC}">${values}</saml:Attribute>`;
    })
    .join('');
  return `<saml:AttributeStatement>${attrs}</saml:AttributeStatement>`;
}

const authnStatement = (authnInstant: string, sessionIndex: string, sessionNotOnOrAfter?: string): string =>
  `<saml:AuthnStatement AuthnInstant="${xmlEscape(authnInstant)}" SessionIndex="${xmlEscape(sessionIndex)}"${sessionNotOnOrAfter ? ` SessionNotOnOrAfter="${xmlEscape(sessionNotOnOrAfter)}"` : ''}>` +
  `<saml:AuthnContext><saml:AuthnContextClassRef>${AC_PASSWORD_PROTECTED}</saml:AuthnContextClassRef></saml:AuthnContext></saml:AuthnStatement>`;

// ---------------------------------------------------------------------------------------------
// (a) samlify as the IdP

/**
 * samlify refuses to parse any message until a schema validator is registered (it ships none).
 * This IdP is a test counterpart: the messages it parses are the AuthnRequests node-saml builds,
 * and what is under test is orgauth's SP, whose checks are node-saml's, not samlify's. So the
 * validator accepts everything; it is module-wide in samlify, which only this helper uses.
 */
setSchemaValidator({ validate: async () => 'skipped: test IdP' });

export interface SamlIdpOptions {
  entityId?: string;
  ssoUrl?: string;
  /** Default: idpKeyPair(), the key the forge (b) signs with by default too. */
  keyPair?: TestKeyPair;
}

export interface RespondOptions {
  spEntityId: string;
  acsUrl: string;
  /** The AuthnRequest's ID (see parseAuthnRequest); omitted for an IdP-initiated response. */
  inResponseTo?: string;
  nameId: string;
  /** Default emailAddress. */
  nameIdFormat?: string;
  /** Default { email: nameId }. Pass {} for none. */
  attributes?: Record<string, string | string[]>;
  sessionIndex?: string;
  /** Sign the Response too (the assertion is always signed). Default false. */
  signResponse?: boolean;
}

export interface ParsedAuthnRequest {
  id: string;
  issuer: string;
  /** AssertionConsumerServiceURL, when the request names one. */
  acsUrl?: string;
  destination?: string;
  issueInstant?: string;
  /** RelayState, when parsed from a redirect URL that carries one. */
  relayState?: string;
  xml: string;
}

export interface TestSamlIdp extends TestKeyPair {
  entityId: string;
  ssoUrl: string;
  /** The IdP's metadata (EntityDescriptor with the signing certificate and SSO endpoints). */
  metadataXml(): string;
  /** A base64 SAMLResponse for HTTP-POST to `acsUrl`, its assertion signed (5 minutes valid). */
  respond(options: RespondOptions): Promise<string>;
  /** Responses built field by field, and the attacks, signed with this IdP's key and issued as it. */
  forge: ResponseForge;
}

export function createSamlIdp(options: SamlIdpOptions = {}): TestSamlIdp {
  const keyPair = options.keyPair ?? idpKeyPair();
  const entityId = options.entityId ?? DEFAULT_IDP_ENTITY_ID;
  const ssoUrl = options.ssoUrl ?? DEFAULT_IDP_SSO_URL;
  const idp = IdentityProvider({
    entityID: entityId,
    privateKey: keyPair.privateKeyPem,
    signingCert: keyPair.certificatePem,
    requestSignatureAlgorithm: 'http://www.w3.org/2001/04/xmldsig-more#rsa-sha256',
    nameIDFormat: [NAMEID_FORMAT.emailAddress, NAMEID_FORMAT.persistent],
    singleSignOnService: [
      { Binding: Constants.namespace.binding.redirect, Location: ssoUrl },
      { Binding: Constants.namespace.binding.post, Location: ssoUrl },
    ],
    // Not served; declared because samlify prints a warning for an IdP without one.
    singleLogoutService: [{ Binding: Constants.namespace.binding.redirect, Location: new URL('logout', ssoUrl).href }],
    generateID: newId,
  });

  return {
    ...keyPair,
    entityId,
    ssoUrl,
    metadataXml: () => idp.getMetadata(),
    async respond(o) {
      // samlify's SP entity: only what createLoginResponse reads (ACS, entity ID, what to sign).
      const sp = ServiceProvider({
        entityID: o.spEntityId,
        assertionConsumerService: [{ Binding: Constants.namespace.binding.post, Location: o.acsUrl }],
        wantAssertionsSigned: true,
        wantMessageSigned: o.signResponse ?? false,
      });
      const now = new Date();
      const later = new Date(now.getTime() + 5 * 60_000).toISOString();
      const values: Record<string, string | undefined> = {
        ID: newId(),
        AssertionID: newId(),
        Destination: o.acsUrl,
        Audience: o.spEntityId,
        SubjectRecipient: o.acsUrl,
        Issuer: entityId,
        IssueInstant: now.toISOString(),
        StatusCode: STATUS_SUCCESS,
        ConditionsNotBefore: now.toISOString(),
        ConditionsNotOnOrAfter: later,
        SubjectConfirmationDataNotOnOrAfter: later,
        NameIDFormat: o.nameIdFormat ?? NAMEID_FORMAT.emailAddress,
        NameID: o.nameId,
        InResponseTo: o.inResponseTo,
      };
      const statements =
        authnStatement(now.toISOString(), o.sessionIndex ?? newId()) + attributeStatement(o.attributes ?? { email: o.nameId });
      const { context } = await idp.createLoginResponse(sp, { extract: {} }, 'post', {}, {
        // samlify's own substitution leaves AuthnStatement and AttributeStatement empty, so the
        // template (samlify's default login response) is filled here; samlify then signs it.
        customTagReplacement: (template) => {
          let xml = template;
          for (const [tag, value] of Object.entries(values)) {
            // An absent value drops the attribute (InResponseTo of an IdP-initiated response).
            xml = value === undefined ? xml.replace(new RegExp(`\\s+[\\w:]+="\\{${tag}\\}"`, 'g'), '') : xml.replaceAll(`{${tag}}`, xmlEscape(value));
          }
          return { id: values.ID ?? '', context: xml.replace('{AuthnStatement}', statements).replace('{AttributeStatement}', '') };
        },
      });
      return context;
    },
    forge: responseForge(keyPair, { issuer: entityId }),
  };
}

/**
 * Reads the AuthnRequest an SP sent by HTTP-Redirect: the redirect URL itself (SAMLRequest and
 * RelayState query parameters) or the SAMLRequest value alone (deflated, base64). A SAMLRequest
 * that does not inflate is taken as HTTP-POST's plain base64.
 */
export function parseAuthnRequest(redirectUrlOrSamlRequest: string | URL): ParsedAuthnRequest {
  let samlRequest = String(redirectUrlOrSamlRequest);
  let relayState: string | undefined;
  if (/^https?:\/\//.test(samlRequest)) {
    const url = new URL(samlRequest);
    samlRequest = url.searchParams.get('SAMLRequest') ?? '';
    relayState = url.searchParams.get('RelayState') ?? undefined;
    if (!samlRequest) throw new Error('no SAMLRequest in the URL');
  }
  const bytes = Buffer.from(samlRequest, 'base64');
  let xml: string;
  try {
    xml = inflateRawSync(bytes).toString('utf8');
  } catch {
    xml = bytes.toString('utf8');
  }
  const attribute = (name: string): string | undefined => {
    const root = /<(?:\w+:)?AuthnRequest\b[^>]*>/.exec(xml)?.[0] ?? '';
    const match = new RegExp(`\\s${name}="([^"]*)"`).exec(root);
    return match?.[1]?.replace(/&quot;/g, '"').replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&amp;/g, '&');
  };
  const id = attribute('ID');
  if (!id) throw new Error(`not an AuthnRequest: ${xml.slice(0, 200)}`);
  const issuer = /<(?:\w+:)?Issuer\b[^>]*>([^<]*)<\/(?:\w+:)?Issuer>/.exec(xml)?.[1] ?? '';
  return {
    id,
    issuer,
    ...(attribute('AssertionConsumerServiceURL') !== undefined ? { acsUrl: attribute('AssertionConsumerServiceURL') } : {}),
    ...(attribute('Destination') !== undefined ? { destination: attribute('Destination') } : {}),
    ...(attribute('IssueInstant') !== undefined ? { issueInstant: attribute('IssueInstant') } : {}),
    ...(relayState !== undefined ? { relayState } : {}),
    xml,
  };
}

// ---------------------------------------------------------------------------------------------
// (b) Responses from string templates, signed with xml-crypto

export interface AssertionFields {
  /** Issuer of both the Response and the Assertion. */
  issuer: string;
  /** Response@Destination. */
  destination: string;
  /** SubjectConfirmationData@Recipient. */
  recipient: string;
  audience: string;
  /** Response@InResponseTo and SubjectConfirmationData@InResponseTo; null: absent (IdP-initiated). */
  inResponseTo: string | null;
  issueInstant: string;
  /** Conditions@NotBefore. */
  notBefore: string;
  /** Conditions@NotOnOrAfter. */
  notOnOrAfter: string;
  /** SubjectConfirmationData@NotOnOrAfter. */
  subjectNotOnOrAfter: string;
  authnInstant: string;
  assertionId: string;
  responseId: string;
  nameId: string;
  nameIdFormat: string;
  /** The `email` attribute; null: no attribute statement entry for it. */
  email: string | null;
  /** More attributes, besides email. */
  attributes: Record<string, string | string[]>;
  sessionIndex: string;
  statusCode: string;
}

/** What a test must say; everything else has a valid default (now, 5 minutes, fresh IDs, email = nameId). */
export type AssertionFieldsInput = { acsUrl: string; spEntityId: string; nameId: string } & Partial<AssertionFields>;

export function assertionFields(input: AssertionFieldsInput, defaults: { issuer?: string } = {}): AssertionFields {
  const now = new Date();
  const later = new Date(now.getTime() + 5 * 60_000).toISOString();
  const { acsUrl, spEntityId, ...overrides } = input;
  return {
    issuer: defaults.issuer ?? DEFAULT_IDP_ENTITY_ID,
    destination: acsUrl,
    recipient: acsUrl,
    audience: spEntityId,
    inResponseTo: null,
    issueInstant: now.toISOString(),
    notBefore: now.toISOString(),
    notOnOrAfter: later,
    subjectNotOnOrAfter: later,
    authnInstant: now.toISOString(),
    assertionId: newId(),
    responseId: newId(),
    nameIdFormat: NAMEID_FORMAT.emailAddress,
    email: input.nameId,
    attributes: {},
    sessionIndex: newId(),
    statusCode: STATUS_SUCCESS,
    ...overrides,
  };
}

/**
 * The Assertion element alone. It declares its own namespaces, so it stays well-formed (and its
 * exclusive-c14n digest the same) wherever an attack moves it.
 */
export function buildAssertion(f: AssertionFields): string {
  const inResponseTo = f.inResponseTo === null ? '' : ` InResponseTo="${xmlEscape(f.inResponseTo)}"`;
  const attributes = { ...(f.email === null ? {} : { email: f.email }), ...f.attributes };
  return (
    `<saml:Assertion xmlns:saml="${NS_ASSERTION}" xmlns:xs="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" ID="${xmlEscape(f.assertionId)}" Version="2.0" IssueInstant="${xmlEscape(f.issueInstant)}">` +
    `<saml:Issuer>${xmlEscape(f.issuer)}</saml:Issuer>` +
    `<saml:Subject><saml:NameID Format="${xmlEscape(f.nameIdFormat)}">${xmlEscape(f.nameId)}</saml:NameID>` +
    `<saml:SubjectConfirmation Method="urn:oasis:names:tc:SAML:2.0:cm:bearer"><saml:SubjectConfirmationData NotOnOrAfter="${xmlEscape(f.subjectNotOnOrAfter)}" Recipient="${xmlEscape(f.recipient)}"${inResponseTo}/></saml:SubjectConfirmation></saml:Subject>` +
    `<saml:Conditions NotBefore="${xmlEscape(f.notBefore)}" NotOnOrAfter="${xmlEscape(f.notOnOrAfter)}"><saml:AudienceRestriction><saml:Audience>${xmlEscape(f.audience)}</saml:Audience></saml:AudienceRestriction></saml:Conditions>` +
    authnStatement(f.authnInstant, f.sessionIndex) +
    attributeStatement(attributes) +
    `</saml:Assertion>`
  );
}

/** A Response around `assertions` (XML strings, in that order; default: the one built from `f`). */
export function buildAssertionResponse(f: AssertionFields, assertions: string[] = [buildAssertion(f)], extensions?: string): string {
  const inResponseTo = f.inResponseTo === null ? '' : ` InResponseTo="${xmlEscape(f.inResponseTo)}"`;
  return (
    `<samlp:Response xmlns:samlp="${NS_PROTOCOL}" xmlns:saml="${NS_ASSERTION}" ID="${xmlEscape(f.responseId)}" Version="2.0" IssueInstant="${xmlEscape(f.issueInstant)}" Destination="${xmlEscape(f.destination)}"${inResponseTo}>` +
    `<saml:Issuer>${xmlEscape(f.issuer)}</saml:Issuer>` +
    (extensions === undefined ? '' : `<samlp:Extensions>${extensions}</samlp:Extensions>`) +
    `<samlp:Status><samlp:StatusCode Value="${xmlEscape(f.statusCode)}"/></samlp:Status>` +
    assertions.join('') +
    `</samlp:Response>`
  );
}

export interface SignOptions {
  /** Default sha256. sha1 exists to show what an SP accepts, not because anyone should sign with it. */
  algorithm?: 'sha256' | 'sha1';
}

const ALGORITHMS = {
  sha256: { signature: 'http://www.w3.org/2001/04/xmldsig-more#rsa-sha256', digest: 'http://www.w3.org/2001/04/xmlenc#sha256' },
  sha1: { signature: 'http://www.w3.org/2000/09/xmldsig#rsa-sha1', digest: 'http://www.w3.org/2000/09/xmldsig#sha1' },
} as const;

/**
 * An enveloped signature (exclusive c14n, RSA) of the element `elementXPath` selects, placed
 * right after that element's Issuer as the SAML schema wants, with the certificate in KeyInfo.
 */
function signElement(xml: string, elementXPath: string, keyPem: string, certPem: string, options: SignOptions): string {
  const algorithm = ALGORITHMS[options.algorithm ?? 'sha256'];
  const sig = new SignedXml({
    privateKey: keyPem,
    publicCert: certPem,
    signatureAlgorithm: algorithm.signature,
    canonicalizationAlgorithm: 'http://www.w3.org/2001/10/xml-exc-c14n#',
  });
  sig.addReference({
    xpath: elementXPath,
    transforms: ['http://www.w3.org/2000/09/xmldsig#enveloped-signature', 'http://www.w3.org/2001/10/xml-exc-c14n#'],
    digestAlgorithm: algorithm.digest,
  });
  sig.computeSignature(xml, { prefix: 'ds', location: { reference: `${elementXPath}/*[local-name(.)='Issuer']`, action: 'after' } });
  return sig.getSignedXml();
}

/** Signs the Assertion with ID `assertionId` (default: the Response's only direct Assertion). */
export function signAssertion(xml: string, keyPem: string, certPem: string, options: SignOptions & { assertionId?: string } = {}): string {
  const xpath = options.assertionId
    ? `//*[local-name(.)='Assertion' and @ID='${options.assertionId}']`
    : "/*[local-name(.)='Response']/*[local-name(.)='Assertion']";
  return signElement(xml, xpath, keyPem, certPem, options);
}

/** Signs the Response element (after any assertion signature, which it then covers). */
export function signResponse(xml: string, keyPem: string, certPem: string, options: SignOptions = {}): string {
  return signElement(xml, "/*[local-name(.)='Response']", keyPem, certPem, options);
}

export type WrappingVariant =
  /** The unsigned evil assertion (fresh ID) before the signed one: a parser reading the first Assertion reads the evil one. */
  | 'evil-first'
  /**
   * The signed assertion moved into the Response's Extensions, an evil assertion with the same ID
   * in its place: a verifier resolving the Reference by ID finds the original first (document
   * order), a parser reading /Response/Assertion reads the evil one.
   */
  | 'signed-in-extensions'
  /**
   * The evil assertion carries the signature, whose ds:Object holds the original assertion (its
   * ID the Reference's): the digest still matches, the evil assertion is the one in place.
   */
  | 'signed-in-signature-object';

export interface ResponseForge {
  /** The fields a response built from `input` gets (this forge's IdP as issuer). */
  fields(input: AssertionFieldsInput): AssertionFields;
  /** The XML of a valid response: assertion signed, and the Response too if asked. */
  validXml(input: AssertionFieldsInput, options?: SignOptions & { signResponse?: boolean; signAssertion?: boolean }): string;
  /** A valid response, base64. Any field may be overridden to build a signed-but-wrong one. */
  valid(input: AssertionFieldsInput, options?: SignOptions & { signResponse?: boolean; signAssertion?: boolean }): string;
  unsigned(input: AssertionFieldsInput): string;
  /** Signed with another key, that key's certificate in KeyInfo. */
  signedBy(other: TestKeyPair, input: AssertionFieldsInput): string;
  /** A valid signed response whose NameID is then replaced (the signature no longer matches). */
  editNameIdAfterSigning(input: AssertionFieldsInput, newNameId: string): string;
  /** XML signature wrapping: the valid signed assertion kept, an unsigned one with `evil` fields placed where a naive parser reads. */
  wrapWithInjectedAssertion(input: AssertionFieldsInput, evil: Partial<AssertionFields>, variant: WrappingVariant): string;
  /**
   * CVE-2018-0489 style: a validly signed NameID (input.nameId, e.g. admin@corp.example.evil.test)
   * with an XML comment inserted after `visiblePrefix` (admin@corp.example). Exclusive c14n drops
   * comments, so the signature still verifies; an SP reading only the first text node sees the prefix.
   */
  withCommentInNameId(input: AssertionFieldsInput, visiblePrefix: string): string;
}

export function responseForge(keys: TestKeyPair = idpKeyPair(), defaults: { issuer?: string } = {}): ResponseForge {
  const fields = (input: AssertionFieldsInput) => assertionFields(input, defaults);
  const validXml: ResponseForge['validXml'] = (input, options = {}) => {
    const f = fields(input);
    let xml = buildAssertionResponse(f);
    if (options.signAssertion ?? true) xml = signAssertion(xml, keys.privateKeyPem, keys.certificatePem, { ...options, assertionId: f.assertionId });
    if (options.signResponse) xml = signResponse(xml, keys.privateKeyPem, keys.certificatePem, options);
    return xml;
  };
  /** The signed response's assertion, and its signature element, as strings. */
  const signedParts = (input: AssertionFieldsInput) => {
    const f = fields(input);
    const xml = signAssertion(buildAssertionResponse(f), keys.privateKeyPem, keys.certificatePem, { assertionId: f.assertionId });
    const assertion = /<saml:Assertion\b[\s\S]*<\/saml:Assertion>/.exec(xml)?.[0];
    const signature = /<ds:Signature\b[\s\S]*<\/ds:Signature>/.exec(xml)?.[0];
    if (!assertion || !signature) throw new Error('signed assertion not found');
    return { f, xml, assertion, signature };
  };
  const nameIdElement = (nameIdXml: string) => new RegExp(`(<saml:NameID\\b[^>]*>)${nameIdXml.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}(</saml:NameID>)`);

  return {
    fields,
    validXml,
    valid: (input, options) => encodeSamlResponse(validXml(input, options)),
    unsigned: (input) => encodeSamlResponse(buildAssertionResponse(fields(input))),
    signedBy(other, input) {
      const f = fields(input);
      return encodeSamlResponse(signAssertion(buildAssertionResponse(f), other.privateKeyPem, other.certificatePem, { assertionId: f.assertionId }));
    },
    editNameIdAfterSigning(input, newNameId) {
      const xml = validXml(input);
      const edited = xml.replace(nameIdElement(xmlEscape(input.nameId)), `$1${xmlEscape(newNameId)}$2`);
      if (edited === xml) throw new Error('NameID not found');
      return encodeSamlResponse(edited);
    },
    wrapWithInjectedAssertion(input, evil, variant) {
      const { f, assertion, signature } = signedParts(input);
      const evilFields: AssertionFields = { ...f, ...evil };
      switch (variant) {
        case 'evil-first': {
          const injected = buildAssertion({ ...evilFields, assertionId: evil.assertionId ?? newId() });
          return encodeSamlResponse(buildAssertionResponse(f, [injected, assertion]));
        }
        case 'signed-in-extensions': {
          const injected = buildAssertion({ ...evilFields, assertionId: f.assertionId });
          return encodeSamlResponse(buildAssertionResponse(f, [injected], assertion));
        }
        case 'signed-in-signature-object': {
          const original = assertion.replace(signature, '');
          const carried = signature.replace('</ds:Signature>', `<ds:Object>${original}</ds:Object></ds:Signature>`);
          const injected = buildAssertion({ ...evilFields, assertionId: evil.assertionId ?? newId() }).replace(/(<saml:Issuer>[^<]*<\/saml:Issuer>)/, `$1${carried}`);
          return encodeSamlResponse(buildAssertionResponse(f, [injected]));
        }
      }
    },
    withCommentInNameId(input, visiblePrefix) {
      if (!input.nameId.startsWith(visiblePrefix) || input.nameId === visiblePrefix) throw new Error('visiblePrefix must be a proper prefix of nameId');
      const xml = validXml(input);
      const commented = `${xmlEscape(visiblePrefix)}<!---->${xmlEscape(input.nameId.slice(visiblePrefix.length))}`;
      const edited = xml.replace(nameIdElement(xmlEscape(input.nameId)), `$1${commented}$2`);
      if (edited === xml) throw new Error('NameID not found');
      return encodeSamlResponse(edited);
    },
  };
}

/** SHA-256 fingerprint of a PEM certificate, colon-separated hex (what an admin pastes from an IdP console). */
export const certificateFingerprint = (pem: string): string =>
  createHash('sha256').update(Buffer.from(certificateBody(pem), 'base64')).digest('hex').toUpperCase().match(/../g)?.join(':') ?? '';
