// An independently written MCP client against /mcp/: the TypeScript SDK's Client over its streamable HTTP
// transport, driven by tests/mcp/test_interop_ts.py.
//
//   node ts_client.mjs '<plan as JSON>'
//
// The plan: {"url": ".../mcp/", "connections": [{"name", "headers", "ops": [op, ...]}, ...]} where an op is
// {"op": "list"} or {"op": "call", "name", "arguments", "progress": true|false}. The connections run one after
// the other. `listChanged` of a connection holds, for each tools/list_changed notification, the index of the op
// it came during. Each progress notification is printed as it arrives, one JSON line
// {"event": "progress", "connection", "op", "progress", "total", "message"}, so that the test can act while a
// call waits (a reviewer approving it); the last line is {"results": {<connection name>: {...}}}.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ToolListChangedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";

function print(value) {
  process.stdout.write(JSON.stringify(value) + "\n");
}

function errorOf(error) {
  return { name: error?.constructor?.name, code: error?.code, message: String(error?.message ?? error), data: error?.data };
}

async function run(plan, connection) {
  const client = new Client({ name: "toolkeeper-interop-ts", version: "1.0.0" });
  const transport = new StreamableHTTPClientTransport(new URL(plan.url), {
    requestInit: { headers: connection.headers },
  });
  const outcome = { ops: [], listChanged: [] };
  client.setNotificationHandler(ToolListChangedNotificationSchema, () => {
    outcome.listChanged.push(outcome.ops.length); // heard during the op of this index
  });
  try {
    await client.connect(transport);
  } catch (error) {
    outcome.connectError = errorOf(error);
    return outcome;
  }
  outcome.sessionId = transport.sessionId ?? null;
  outcome.protocolVersion = transport.protocolVersion ?? null;
  outcome.serverVersion = client.getServerVersion() ?? null;
  outcome.capabilities = client.getServerCapabilities() ?? null;
  for (const [index, op] of connection.ops.entries()) {
    const done = { op: op.op, name: op.name };
    try {
      if (op.op === "list") {
        done.tools = (await client.listTools()).tools;
      } else if (op.op === "call") {
        done.progress = [];
        const options = { timeout: 60000 };
        if (op.progress) {
          options.resetTimeoutOnProgress = true;
          options.onprogress = (p) => {
            const heard = { progress: p.progress, total: p.total ?? null, message: p.message ?? null };
            done.progress.push(heard);
            print({ event: "progress", connection: connection.name, op: index, ...heard });
          };
        }
        done.result = await client.callTool({ name: op.name, arguments: op.arguments ?? {} }, undefined, options);
      } else {
        throw new Error(`unknown op ${op.op}`);
      }
    } catch (error) {
      done.error = errorOf(error);
    }
    outcome.ops.push(done);
  }
  await client.close();
  return outcome;
}

const plan = JSON.parse(process.argv[2]);
const results = {};
for (const connection of plan.connections) {
  results[connection.name] = await run(plan, connection);
}
print({ results });
