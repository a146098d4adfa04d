// Node's amqplib against Shoal; run by tests/integration/test_compat_amqplib.py as
//
//     node compat.mjs <scenario> <amqp url>
//
// Each scenario prints JSON lines ({"event": ...}) on stdout, ends with {"event": "done"} and
// exit code 0, or prints {"event": "failed", ...} and exits 1. Every wait is bounded, and the
// whole script gives up after SCRIPT_TIMEOUT_MS.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import amqp from 'amqplib';

const SCRIPT_TIMEOUT_MS = 60000;
const AMQPLIB_VERSION = JSON.parse(
  readFileSync(new URL('./node_modules/amqplib/package.json', import.meta.url), 'utf8'),
).version;

function emit(event) {
  process.stdout.write(`${JSON.stringify(event)}\n`);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function until(predicate, what, timeoutMs = 10000) {
  const limit = Date.now() + timeoutMs;
  while (!predicate()) {
    if (Date.now() > limit) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(10);
  }
}

function withTimeout(promise, what, timeoutMs = 10000) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)), timeoutMs);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

const uniqueName = (label) => `shoal-test.amqplib-${label}.${randomBytes(6).toString('hex')}`;

function workerOf(model) {
  return Number(model.connection.serverProperties.shoal_worker);
}

// ------------------------------------------------------------------ scenarios

async function basics(url) {
  const conn = await amqp.connect(url);
  conn.on('error', (err) => emit({ event: 'connection-error', message: String(err) }));
  const capabilities = conn.connection.serverProperties.capabilities;
  assert.equal(capabilities.publisher_confirms, true);
  assert.equal(capabilities.consumer_cancel_notify, true);
  emit({ event: 'connected', worker: workerOf(conn), amqplib: AMQPLIB_VERSION });

  const ch = await conn.createConfirmChannel();
  const queue = uniqueName('basics');
  const declared = await ch.assertQueue(queue, { durable: false, autoDelete: false });
  assert.deepEqual([declared.queue, declared.messageCount, declared.consumerCount], [queue, 0, 0]);

  // Publisher confirms.
  for (let i = 0; i < 6; i++) {
    ch.sendToQueue(queue, Buffer.from(`m${i}`), { messageId: String(i), contentType: 'text/plain' });
  }
  await withTimeout(ch.waitForConfirms(), 'six publisher confirms');
  emit({ event: 'confirmed', count: 6 });

  // Mandatory returns.
  const returned = new Promise((resolve) => ch.once('return', resolve));
  ch.publish('amq.direct', `${queue}.nowhere`, Buffer.from('lost'), { mandatory: true });
  const message = await withTimeout(returned, 'basic.return');
  assert.equal(message.fields.replyCode, 312);
  assert.equal(message.fields.replyText, 'NO_ROUTE');
  assert.equal(message.content.toString(), 'lost');
  await withTimeout(ch.waitForConfirms(), 'the confirm of the returned message');
  emit({ event: 'returned', replyCode: message.fields.replyCode });

  // basic.qos: prefetch 2 means at most two unacked deliveries.
  await ch.prefetch(2);
  const received = [];
  const { consumerTag } = await ch.consume(queue, (msg) => received.push(msg), { noAck: false });
  await until(() => received.length >= 2, 'two deliveries');
  await sleep(300);
  assert.equal(received.length, 2, 'prefetch 2 was not honoured');
  let acked = 0;
  while (received.length < 6) {
    const seen = received.length;
    for (const msg of received.slice(acked, seen)) ch.ack(msg);
    acked = seen;
    await until(() => received.length > seen, 'more deliveries');
  }
  for (const msg of received.slice(acked)) ch.ack(msg);
  assert.deepEqual(received.map((m) => m.content.toString()), ['m0', 'm1', 'm2', 'm3', 'm4', 'm5']);
  assert.deepEqual(received.map((m) => m.properties.messageId), ['0', '1', '2', '3', '4', '5']);
  assert.equal(received[0].properties.contentType, 'text/plain');
  assert.ok(received.every((m) => !m.fields.redelivered));
  emit({ event: 'consumed', count: received.length });

  // Client cancel.
  const cancelOk = await ch.cancel(consumerTag);
  assert.equal(cancelOk.consumerTag, consumerTag);
  ch.sendToQueue(queue, Buffer.from('after cancel'));
  await withTimeout(ch.waitForConfirms(), 'the confirm after cancel');
  await sleep(200);
  assert.equal(received.length, 6);
  assert.equal((await ch.checkQueue(queue)).messageCount, 1);

  // basic.get, nack with requeue, reject without.
  const first = await ch.get(queue, { noAck: false });
  assert.equal(first.content.toString(), 'after cancel');
  assert.equal(first.fields.redelivered, false);
  ch.nack(first, false, true);
  const again = await ch.get(queue, { noAck: false });
  assert.equal(again.fields.redelivered, true);
  ch.reject(again, false);
  assert.equal(await ch.get(queue), false);
  emit({ event: 'get-nack-reject' });

  // Broker cancel: deleting the queue cancels its consumer (the callback gets null).
  let cancelled = false;
  await ch.consume(queue, (msg) => {
    if (msg === null) cancelled = true;
  });
  const admin = await conn.createChannel();
  await admin.deleteQueue(queue);
  await until(() => cancelled, 'basic.cancel from the broker');
  emit({ event: 'broker-cancel' });

  // A channel error (404) closes that channel only.
  const doomed = await conn.createChannel();
  doomed.on('error', () => {});
  await assert.rejects(doomed.checkQueue(uniqueName('absent')), /404/);
  const healthy = await conn.createChannel();
  const scratch = await healthy.assertQueue('', { exclusive: true });
  assert.match(scratch.queue, /^amq\.gen-/);
  await conn.close();
}

async function recover(url) {
  const queue = uniqueName('recover');
  const consumed = [];
  let connects = 0;
  let disconnects = 0;
  let worker = null;
  const conn = await amqp.connect(url, {
    recovery: {
      initialDelay: 100,
      maxDelay: 1000,
      jitter: 0,
      maxRetries: 60,
      async setup(model) {
        // amqplib's recovery calls this after every (re)connect: topology and consumers.
        connects += 1;
        worker = workerOf(model);
        const ch = await model.createChannel();
        await ch.prefetch(5);
        await ch.assertQueue(queue, { durable: false, autoDelete: false });
        await ch.consume(queue, (msg) => {
          if (msg === null) return;
          const body = msg.content.toString();
          consumed.push({ body, redelivered: msg.fields.redelivered });
          if (body !== 'held' || msg.fields.redelivered) ch.ack(msg);
        });
      },
    },
  });
  conn.on('disconnect', () => {
    disconnects += 1;
  });
  conn.on('error', () => {});

  const publish = async (body) => {
    const pub = await amqp.connect(url);
    const ch = await pub.createConfirmChannel();
    ch.sendToQueue(queue, Buffer.from(body));
    await withTimeout(ch.waitForConfirms(), `the confirm of ${body}`);
    await pub.close();
  };

  await publish('held');
  await until(() => consumed.length >= 1, 'the first delivery');
  assert.deepEqual(consumed[0], { body: 'held', redelivered: false });
  emit({ event: 'kill-me', worker });

  await until(() => consumed.length >= 2, 'the held message to be redelivered', 30000);
  assert.deepEqual(consumed[1], { body: 'held', redelivered: true });
  assert.ok(disconnects >= 1, 'no disconnect event');
  assert.ok(connects >= 2, 'setup did not run again');
  emit({ event: 'recovered', connects, disconnects });

  await publish('after recovery');
  await until(() => consumed.some((c) => c.body === 'after recovery'), 'a message after recovery');
  const ch = await conn.createChannel();
  assert.equal((await ch.checkQueue(queue)).messageCount, 0);
  await ch.deleteQueue(queue);
  await conn.close();
}

// Issue-4 features.

async function exchangeBind(url) {
  const conn = await amqp.connect(url);
  conn.on('error', () => {});
  const ch = await conn.createChannel();
  ch.on('error', () => {});
  const source = uniqueName('src');
  const destination = uniqueName('dst');
  await ch.assertExchange(source, 'topic', { autoDelete: true });
  await ch.assertExchange(destination, 'fanout', { autoDelete: true });
  const { queue } = await ch.assertQueue('', { exclusive: true });
  await ch.bindQueue(queue, destination, '');
  await ch.bindExchange(destination, source, 'a.#');
  ch.publish(source, 'a.b', Buffer.from('through'));
  let got = false;
  const limit = Date.now() + 2000;
  while (!got && Date.now() < limit) {
    got = await ch.get(queue, { noAck: true });
    if (!got) await sleep(20);
  }
  assert.ok(got, 'nothing arrived through the exchange binding');
  assert.equal(got.content.toString(), 'through');
  await conn.close();
}

async function ttlDeadLetter(url) {
  const conn = await amqp.connect(url);
  conn.on('error', () => {});
  const ch = await conn.createChannel();
  ch.on('error', () => {});
  const dead = (await ch.assertQueue('', { exclusive: true })).queue;
  const source = (
    await ch.assertQueue('', {
      exclusive: true,
      messageTtl: 50,
      deadLetterExchange: '',
      deadLetterRoutingKey: dead,
    })
  ).queue;
  ch.sendToQueue(source, Buffer.from('expires'));
  let got = false;
  const limit = Date.now() + 2000;
  while (!got && Date.now() < limit) {
    got = await ch.get(dead, { noAck: true });
    if (!got) await sleep(20);
  }
  assert.ok(got, 'the expired message was not dead-lettered');
  assert.equal(got.properties.headers['x-death'][0].reason, 'expired');
  await conn.close();
}

async function directReplyTo(url) {
  const conn = await amqp.connect(url);
  conn.on('error', () => {});
  const ch = await conn.createChannel();
  ch.on('error', () => {});
  const { queue } = await ch.assertQueue('', { exclusive: true });
  await ch.consume(queue, (msg) => ch.sendToQueue(msg.properties.replyTo, Buffer.from(`pong:${msg.content}`)), {
    noAck: true,
  });
  const replies = [];
  await ch.consume('amq.rabbitmq.reply-to', (msg) => replies.push(msg.content.toString()), { noAck: true });
  ch.sendToQueue(queue, Buffer.from('ping'), { replyTo: 'amq.rabbitmq.reply-to' });
  await until(() => replies.length > 0, 'the direct reply', 3000);
  assert.deepEqual(replies, ['pong:ping']);
  await conn.close();
}

// Publishes still buffered by amqplib when conn.close() runs: amqplib writes connection.close
// on channel 0 ahead of them, so the broker reads publishes after the close. It must answer
// close-ok and read on until the client closes (RabbitMQ does); closing the socket with that
// input unread sends a TCP reset, and close() rejects with EPIPE / ECONNRESET instead.
async function pipelinedClose(url) {
  const queue = uniqueName('pipelined-close');
  for (let round = 0; round < 5; round++) {
    const conn = await amqp.connect(url);
    const errors = [];
    conn.on('error', (err) => errors.push(String(err.message)));
    const ch = await conn.createChannel();
    await ch.assertQueue(queue, { autoDelete: false });
    for (let i = 0; i < 20000; i++) ch.sendToQueue(queue, Buffer.alloc(100));
    await withTimeout(conn.close(), 'connection.close-ok');
    assert.deepEqual(errors, []);
    emit({ event: 'closed', round });
  }
  const conn = await amqp.connect(url);
  const ch = await conn.createChannel();
  await ch.deleteQueue(queue);
  await conn.close();
}

const SCENARIOS = {
  basics,
  'pipelined-close': pipelinedClose,
  recover,
  'exchange-bind': exchangeBind,
  'ttl-dead-letter': ttlDeadLetter,
  'direct-reply-to': directReplyTo,
};

const [scenario, url] = process.argv.slice(2);
const run = SCENARIOS[scenario];
if (!run || !url) {
  emit({ event: 'failed', error: `usage: node compat.mjs {${Object.keys(SCENARIOS).join('|')}} <amqp url>` });
  process.exit(2);
}
const watchdog = setTimeout(() => {
  emit({ event: 'failed', error: `script timeout after ${SCRIPT_TIMEOUT_MS} ms` });
  process.exit(1);
}, SCRIPT_TIMEOUT_MS);
try {
  await run(url);
  emit({ event: 'done', scenario, amqplib: AMQPLIB_VERSION });
  clearTimeout(watchdog);
  process.exit(0);
} catch (err) {
  emit({ event: 'failed', scenario, error: String(err && err.stack ? err.stack : err) });
  process.exit(1);
}
