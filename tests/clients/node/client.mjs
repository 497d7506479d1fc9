// A Node.js client of bertzoo's gRPC API, built from the .proto alone (no generated code):
//   node client.mjs JOB.json
// JOB: {"target": "host:port", "proto": "path/to/bertzoo.proto", "texts": [...], "pairs": [[a, b], ...],
//       "qa": [[question, context], ...]}
// It calls ModelInfo, each task's unary RPC and SentimentStream (one request per text, with an empty request in the
// middle, which must be answered in its place), and prints every answer as one JSON object for the Python test to
// compare with its own client's.
import { readFileSync } from "node:fs";
import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

const job = JSON.parse(readFileSync(process.argv[2], "utf8"));
const definition = protoLoader.loadSync(job.proto, {
  keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
});
const { Bertzoo } = grpc.loadPackageDefinition(definition).bertzoo.v1;
const client = new Bertzoo(job.target, grpc.credentials.createInsecure());
const deadline = () => new Date(Date.now() + 60_000);

function unary(method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: deadline() }, (error, response) => (error ? reject(error) : resolve(response)));
  });
}

function stream(method, requests) {
  return new Promise((resolve, reject) => {
    const call = client[method]({ deadline: deadline() });
    const answers = [];
    call.on("data", (message) => answers.push(message));
    call.on("error", reject);
    call.on("end", () => resolve(answers));
    for (const request of requests) call.write(request);
    call.end();
  });
}

const pairs = job.pairs.map(([text_a, text_b]) => ({ text_a, text_b }));
const out = {
  model_info: await unary("ModelInfo", {}),
  sentiment: await unary("Sentiment", { texts: job.texts }),
  paraphrase: await unary("Paraphrase", { pairs }),
  similarity: await unary("Similarity", { pairs }),
  qa: await unary("QA", { items: job.qa.map(([question, context]) => ({ question, context })) }),
  embed: await unary("Embed", { texts: job.texts }),
};
const middle = Math.floor(job.texts.length / 2);
const requests = job.texts.map((text) => ({ texts: [text] }));
requests.splice(middle, 0, { texts: [] });
out.sentiment_stream = await stream("SentimentStream", requests);
try {
  await unary("Sentiment", { texts: [] });
  out.empty_unary = "OK";
} catch (error) {
  out.empty_unary = grpc.status[error.code];
}
client.close();
process.stdout.write(JSON.stringify(out));
