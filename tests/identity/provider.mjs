// The OpenID provider of the single sign-on tests: the npm package `oidc-provider`, configured from a JSON
// file named on the command line, on a port of 127.0.0.1.
//
// The file holds {"port", "clients": [...], "accounts": {"<login>": {"email", "email_verified", "name",
// "groups", "disabled"}}}. Accounts are read from the file at every look-up, so a test disables a person by
// rewriting it: the provider then issues nothing for them (a login that names no account, or a disabled one,
// returns to its login form, and a code issued before is refused at the token endpoint). The provider's own
// login form (its development interactions) takes any password.
import { readFileSync } from 'node:fs';
import Provider from 'oidc-provider';

const configPath = process.argv[2];
const read = () => JSON.parse(readFileSync(configPath, 'utf8'));
const config = read();
const issuer = `http://127.0.0.1:${config.port}`;

function account(login) {
  const person = read().accounts[login];
  if (!person || person.disabled) return undefined;
  return {
    accountId: login,
    async claims() {
      return {
        sub: login,
        email: person.email,
        email_verified: person.email_verified ?? true,
        name: person.name ?? login,
        groups: person.groups ?? [],
      };
    },
  };
}

const provider = new Provider(issuer, {
  clients: config.clients,
  async findAccount(ctx, login) {
    return account(login);
  },
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name'],
    groups: ['groups'],
  },
  scopes: ['openid', 'email', 'profile', 'groups', 'offline_access', 'agent', 'files', 'items'],
  pkce: { required: () => true },
  features: {
    devInteractions: { enabled: true },
    rpInitiatedLogout: { enabled: true },
    backchannelLogout: { enabled: true },
    // As an MCP client's authorization server: clients register themselves and get JWT access tokens for the
    // resource they name (Toolkeeper's MCP endpoint), with the `agent` scope.
    registration: { enabled: true },
    revocation: { enabled: true },
    // A service account of an HTTP API (the accounts tests): a registered client gets its own token.
    clientCredentials: { enabled: true },
    // "resources" in the file names other resource servers (an upstream MCP server of the accounts tests) with
    // their scope and token lifetime.
    resourceIndicators: {
      enabled: true,
      useGrantedResource: () => true,
      async getResourceServerInfo(ctx, resourceIndicator) {
        const server = (read().resources || {})[resourceIndicator] || { scope: 'agent', ttl: 300 };
        return { scope: server.scope, audience: resourceIndicator, accessTokenTTL: server.ttl,
                 accessTokenFormat: 'jwt', jwt: { sign: { alg: 'RS256' } } };
      },
    },
  },
  // A client that registered for refresh tokens gets them (with rotation for public clients, the default).
  async issueRefreshToken(ctx, client) {
    return client.grantTypeAllowed('refresh_token');
  },
  // The console is a first-party client: the person is not asked to consent to the scopes it was configured with.
  // Other clients (an MCP client that registered itself) get the provider's own consent page for what more they ask.
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({ clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId });
    grant.addOIDCScope('openid email profile groups');
    grant.addOIDCClaims(['email', 'email_verified', 'name', 'groups']);
    await grant.save();
    return grant;
  },
  cookies: { keys: ['identity-tests-only'] },
  // Its requests (the back-channel logouts) go to Toolkeeper on this machine: its guard against loopback
  // addresses, right for a real deployment, stands aside here.
  fetch: (url, options) => {
    const { dispatcher, ...rest } = options;
    return globalThis.fetch(url, rest);
  },
  ttl: { Session: 3600, Interaction: 600, Grant: 3600, IdToken: 300, AccessToken: 300, AuthorizationCode: 60 },
});

// The tests' own door, as a provider's admin console would act: "/test/signed-out/<login>" tells every client
// with a back-channel logout URI that the person's session ended (as disabling them does at a real provider).
provider.use(async (ctx, next) => {
  const match = ctx.method === 'POST' && ctx.path.match(/^\/test\/signed-out\/([^/]+)$/);
  if (!match) return next();
  const results = [];
  for (const { client_id: clientId } of read().clients) {
    const client = await provider.Client.find(clientId);
    if (client?.backchannelLogoutUri) {
      results.push(await client.backchannelLogout(decodeURIComponent(match[1])).then(() => 'ok', (err) => String(err)));
    }
  }
  ctx.body = { results };
});

provider.listen(config.port, '127.0.0.1', () => {
  console.log(`ready ${issuer}`);
});
