/**
 * A WebAuthn authenticator in software, for tests: one ES256 (P-256) discoverable credential,
 * "none" attestation, answering the options our server gives as a browser would pass them on
 * (PublicKeyCredential.toJSON()). Each answer can be bent (another origin, RP ID, challenge, no
 * UV flag, a counter going backwards) to see the server refuse it.
 */
import { createHash, generateKeyPairSync, randomBytes, sign } from 'node:crypto';
import { type CBORType, encodeCBOR } from '@levischuck/tiny-cbor';
import type {
  AuthenticationResponseJSON,
  PublicKeyCredentialCreationOptionsJSON,
  PublicKeyCredentialRequestOptionsJSON,
  RegistrationResponseJSON,
} from '@simplewebauthn/server';

const UP = 0x01;
const UV = 0x04;
const BE = 0x08;
const BS = 0x10;
const AT = 0x40;

export interface Bend {
  origin?: string;
  rpId?: string;
  challenge?: string;
  type?: string;
  /** The UV flag (default: set). */
  uv?: boolean;
  /** The counter to report (default: one more than the last). */
  counter?: number;
}

const b64 = (bytes: Uint8Array | Buffer) => Buffer.from(bytes).toString('base64url');
const sha256 = (data: Uint8Array | string) => createHash('sha256').update(data).digest();

export class SoftAuthenticator {
  readonly credentialId = randomBytes(32);
  private readonly keys = generateKeyPairSync('ec', { namedCurve: 'P-256' });
  /** The last counter reported. */
  counter = 0;
  /** The user handle the server gave at registration (returned with every assertion). */
  userHandle: string | undefined;

  constructor(
    readonly origin: string,
    /** BE and BS: a synced passkey (RFC 8176 swk) rather than one bound to the device (hwk). */
    readonly backedUp = false,
  ) {}

  get id(): string {
    return b64(this.credentialId);
  }

  private coseKey(): Uint8Array {
    const jwk = this.keys.publicKey.export({ format: 'jwk' });
    // RFC 9053: kty EC2 (2), alg ES256 (-7), crv P-256 (1), x, y.
    return encodeCBOR(
      new Map<number, number | Uint8Array>([
        [1, 2],
        [3, -7],
        [-1, 1],
        [-2, Buffer.from(jwk.x!, 'base64url')],
        [-3, Buffer.from(jwk.y!, 'base64url')],
      ]),
    );
  }

  /** §6.1 authenticator data: rpIdHash, flags, signCount, and attested credential data when registering. */
  private authenticatorData(rpId: string, bend: Bend, attested: boolean): Buffer {
    const counter = bend.counter ?? this.counter + 1;
    this.counter = counter;
    const flags = UP | (bend.uv === false ? 0 : UV) | (this.backedUp ? BE | BS : 0) | (attested ? AT : 0);
    const head = Buffer.alloc(37);
    sha256(rpId).copy(head, 0);
    head.writeUInt8(flags, 32);
    head.writeUInt32BE(counter, 33);
    if (!attested) return head;
    const idLength = Buffer.alloc(2);
    idLength.writeUInt16BE(this.credentialId.length);
    return Buffer.concat([head, Buffer.alloc(16), idLength, this.credentialId, this.coseKey()]);
  }

  private clientData(type: string, challenge: string, bend: Bend): Buffer {
    return Buffer.from(JSON.stringify({ type: bend.type ?? type, challenge: bend.challenge ?? challenge, origin: bend.origin ?? this.origin, crossOrigin: false }));
  }

  /** PublicKeyCredential.toJSON() around `response`. */
  private credential<R>(response: R) {
    return { id: this.id, rawId: this.id, type: 'public-key' as const, response, authenticatorAttachment: 'platform' as const, clientExtensionResults: {} };
  }

  /** navigator.credentials.create(), attestation "none". */
  register(options: PublicKeyCredentialCreationOptionsJSON, bend: Bend = {}): RegistrationResponseJSON {
    this.userHandle = options.user.id;
    const authData = this.authenticatorData(bend.rpId ?? options.rp.id ?? new URL(this.origin).hostname, { counter: 0, ...bend }, true);
    return this.credential({
      clientDataJSON: b64(this.clientData('webauthn.create', options.challenge, bend)),
      attestationObject: b64(encodeCBOR(new Map<string, CBORType>([['fmt', 'none'], ['attStmt', new Map()], ['authData', authData]]))),
      transports: ['internal'],
    });
  }

  /** navigator.credentials.get(): signs authenticatorData || SHA-256(clientDataJSON) (§6.3.3). */
  assert(options: PublicKeyCredentialRequestOptionsJSON, bend: Bend = {}): AuthenticationResponseJSON {
    const authData = this.authenticatorData(bend.rpId ?? options.rpId ?? new URL(this.origin).hostname, bend, false);
    const clientDataJSON = this.clientData('webauthn.get', options.challenge, bend);
    const signature = sign('sha256', Buffer.concat([authData, sha256(clientDataJSON)]), this.keys.privateKey);
    return this.credential({
      clientDataJSON: b64(clientDataJSON),
      authenticatorData: b64(authData),
      signature: b64(signature),
      ...(this.userHandle === undefined ? {} : { userHandle: this.userHandle }),
    });
  }
}
