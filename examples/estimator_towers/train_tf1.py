"""Train a small convnet with tf.estimator on the GPUs of one machine (TensorFlow 1, 2018 style).

    python -m legacy.run_tf1 examples/estimator_towers/train_tf1.py --data_dir DIR --num_gpus 2
    python -m legacy.run_tf1 examples/estimator_towers/train_tf1.py --data_dir DIR --num_gpus 2 --multi_gpu replicate
    python -m legacy.run_tf1 examples/estimator_towers/train_tf1.py --data_dir DIR --num_gpus 2 --multi_gpu towers

Written for TensorFlow 1.x and run as it is on TensorFlow 2.21 by `legacy/run_tf1/` (tf.estimator from
tensorflow-estimator 2.15.0): `import tensorflow as tf`, `tf.app.flags`, `tf.layers`, an `input_fn`
over TFRecords and a `model_fn`, trained by `Estimator.train` and then measured by
`Estimator.evaluate`.  The network: conv 3x3x16 -> batch norm -> relu -> conv 3x3x32 stride 2 ->
batch norm -> relu -> global average pool -> 10 logits; the loss: softmax cross-entropy plus weight
decay (`l2_loss`, half the squared norm, of every kernel); momentum on a piecewise-constant rate.

Its three multi-GPU forms (`--multi_gpu`), each as TF 1.x ran it:

- `mirrored` (the default), `RunConfig(train_distribute=tf.contrib.distribute.MirroredStrategy(num_gpus=N))`:
  the `model_fn` runs once per GPU, each replica on a batch of its own from the `input_fn` (whose
  batch size is the global one divided by N, as the official models of 2018 divided it); the
  optimizer divides each replica's loss by N and the replicas' gradients are summed: the mean of the
  global batch, the weight decay once.  Each replica moves its own copy of the batch-norm statistics.
- `replicate`, `tf.contrib.estimator.replicate_model_fn(model_fn, loss_reduction)` with the optimizer
  wrapped in `TowerOptimizer`: the `input_fn` gives the global batch, cut by `tf.split` into one
  shard per GPU; with `--loss_reduction sum` (contrib's default) the towers' losses and gradients are
  summed: each tower's mean, and the weight decay N times; `mean` divides each tower's loss by N.
- `towers`, towers built by hand inside the `model_fn`, as the CIFAR-10 Estimator tutorial built them:
  the batch cut by `tf.split`, one tower per GPU with its variables on the CPU, the towers' gradients
  averaged there and applied once; the batch norms' moving statistics move by the first tower's
  batch only (the tutorial's shortcut: "these stats accumulate extremely fast").

Its Keras 3 port is modern_train.py; adapter.py lets the parity harness judge the two.
"""
import os

import tensorflow as tf

IMAGE_SIZE = 16
NUM_CLASSES = 10

FLAGS = tf.app.flags.FLAGS

tf.app.flags.DEFINE_string('data_dir', '/tmp/estimator_towers_data', 'folder of train-*.tfrecord and '
                           'eval-*.tfrecord files')
tf.app.flags.DEFINE_string('model_dir', '/tmp/estimator_towers_model', 'where the Estimator writes checkpoints')
tf.app.flags.DEFINE_integer('num_gpus', 2, 'GPUs to train on, one replica (tower) each')
tf.app.flags.DEFINE_string('multi_gpu', 'mirrored', 'mirrored (a MirroredStrategy), replicate (replicate_model_fn) '
                           'or towers (built by hand in the model_fn)')
tf.app.flags.DEFINE_string('loss_reduction', 'sum', 'replicate_model_fn: sum or mean of the towers\' losses')
tf.app.flags.DEFINE_integer('batch_size', 128, 'images per step, across all GPUs')
tf.app.flags.DEFINE_integer('eval_batch_size', 100, 'images per evaluation step')
tf.app.flags.DEFINE_integer('train_steps', 2000, 'training steps')
tf.app.flags.DEFINE_integer('shuffle_buffer', 1000, 'rows the training input shuffles among')
tf.app.flags.DEFINE_float('learning_rate', 0.1, 'learning rate until the first boundary')
tf.app.flags.DEFINE_string('boundaries', '1000,1500', 'steps at which the rate drops')
tf.app.flags.DEFINE_string('decay_rates', '1,0.1,0.01', 'the rate\'s factor before, between and after them')
tf.app.flags.DEFINE_float('momentum', 0.9, 'momentum')
tf.app.flags.DEFINE_float('weight_decay', 2e-4, 'factor of every kernel\'s l2_loss')
tf.app.flags.DEFINE_float('batch_norm_decay', 0.997, 'decay of batch norm\'s moving statistics')
tf.app.flags.DEFINE_float('batch_norm_epsilon', 1e-5, 'batch norm\'s epsilon')


def parse(serialized):
    """One record -> (image in [-1, 1], float32 [16, 16, 3]; label, int32)."""
    features = tf.parse_single_example(serialized, features={
        'image': tf.FixedLenFeature([], tf.string),
        'label': tf.FixedLenFeature([], tf.int64),
    })
    image = tf.reshape(tf.decode_raw(features['image'], tf.uint8), [IMAGE_SIZE, IMAGE_SIZE, 3])
    image = tf.cast(image, tf.float32) / 127.5 - 1.0
    return image, tf.cast(features['label'], tf.int32)


def input_fn(data_dir, training, batch_size):
    """The training rows (shuffled, repeated) or the evaluation rows (once), in batches."""
    pattern = 'train-*.tfrecord' if training else 'eval-*.tfrecord'
    files = sorted(tf.gfile.Glob(os.path.join(data_dir, pattern)))
    if not files:
        raise ValueError('no %s file in %s' % (pattern, data_dir))
    dataset = tf.data.TFRecordDataset(files)
    if training:
        dataset = dataset.shuffle(FLAGS.shuffle_buffer).repeat()
    return dataset.map(parse).batch(batch_size)


def batch_norm(inputs, training, name):
    return tf.layers.batch_normalization(inputs, momentum=FLAGS.batch_norm_decay, epsilon=FLAGS.batch_norm_epsilon,
                                         training=training, fused=True, name=name)


def network(images, training):
    net = tf.layers.conv2d(images, 16, 3, padding='same', use_bias=False, name='conv1')
    net = tf.nn.relu(batch_norm(net, training, 'bn1'))
    net = tf.layers.conv2d(net, 32, 3, strides=2, padding='same', use_bias=False, name='conv2')
    net = tf.nn.relu(batch_norm(net, training, 'bn2'))
    net = tf.reduce_mean(net, [1, 2])
    return tf.layers.dense(net, NUM_CLASSES, name='logits')


def learning_rate(global_step):
    boundaries = [int(b) for b in FLAGS.boundaries.split(',')]
    values = [FLAGS.learning_rate * float(d) for d in FLAGS.decay_rates.split(',')]
    return tf.train.piecewise_constant(tf.cast(global_step, tf.int32), boundaries, values)


def tower_loss(images, labels, training):
    logits = network(images, training)
    cross_entropy = tf.losses.sparse_softmax_cross_entropy(labels, logits)
    l2 = tf.add_n([tf.nn.l2_loss(v) for v in tf.trainable_variables() if 'kernel' in v.name])
    return cross_entropy + FLAGS.weight_decay * l2, logits


def model_fn(features, labels, mode):
    training = mode == tf.estimator.ModeKeys.TRAIN
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={'classes': tf.argmax(network(features, False), 1)})
    loss, logits = tower_loss(features, labels, training)
    train_op = None
    if training:
        global_step = tf.train.get_or_create_global_step()
        optimizer = tf.train.MomentumOptimizer(learning_rate(global_step), FLAGS.momentum)
        if FLAGS.multi_gpu == 'replicate':
            optimizer = tf.contrib.estimator.TowerOptimizer(optimizer)
        minimize = optimizer.minimize(loss, global_step)
        train_op = tf.group(minimize, tf.get_collection(tf.GraphKeys.UPDATE_OPS))
    metrics = {'accuracy': tf.metrics.accuracy(labels, tf.argmax(logits, 1))}
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op, eval_metric_ops=metrics)


def local_device_setter(worker_device):
    """The tutorial's variable strategy CPU: variables on the CPU, every other op on its tower's device."""
    def choose(op):
        node_def = op if isinstance(op, tf.NodeDef) else op.node_def
        return '/cpu:0' if node_def.op in ('Variable', 'VariableV2', 'VarHandleOp') else worker_device
    return choose


def towers_model_fn(features, labels, mode):
    """One tower per GPU inside the model_fn: each its tf.split shard, the gradients averaged on the CPU."""
    training = mode == tf.estimator.ModeKeys.TRAIN
    images, tower_labels = tf.split(features, FLAGS.num_gpus), tf.split(labels, FLAGS.num_gpus)
    tower_losses, tower_grads, tower_logits = [], [], []
    for i in range(FLAGS.num_gpus):
        with tf.variable_scope('', reuse=bool(i != 0)):
            with tf.name_scope('tower_%d' % i) as name_scope:
                with tf.device(local_device_setter('/gpu:%d' % i)):
                    loss, logits = tower_loss(images[i], tower_labels[i], training)
                    params = tf.trainable_variables()
                    tower_losses.append(loss)
                    tower_grads.append(zip(tf.gradients(loss, params), params))
                    tower_logits.append(logits)
                    if i == 0:
                        # Only the first tower's batch norm updates: "these stats accumulate extremely fast".
                        update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS, name_scope)
    with tf.device('/cpu:0'):
        loss = tf.reduce_mean(tower_losses, name='loss')
        predictions = tf.argmax(tf.concat(tower_logits, 0), 1)
        metrics = {'accuracy': tf.metrics.accuracy(tf.concat(tower_labels, 0), predictions)}
        train_op = None
        if training:
            gradvars = []
            with tf.name_scope('gradient_averaging'):
                for grad_and_vars in zip(*tower_grads):
                    grads = [g for g, _ in grad_and_vars]
                    gradvars.append((tf.multiply(tf.add_n(grads), 1. / len(grads)), grad_and_vars[0][1]))
            global_step = tf.train.get_or_create_global_step()
            optimizer = tf.train.MomentumOptimizer(learning_rate(global_step), FLAGS.momentum)
            train_op = tf.group(optimizer.apply_gradients(gradvars, global_step=global_step), *update_ops)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op, eval_metric_ops=metrics)


def main(argv=None):
    if FLAGS.batch_size % FLAGS.num_gpus:
        raise ValueError('--batch_size %d must be a multiple of --num_gpus %d' % (FLAGS.batch_size, FLAGS.num_gpus))
    strategy, train_batch = None, FLAGS.batch_size
    if FLAGS.multi_gpu == 'replicate':
        reduction = {'sum': tf.losses.Reduction.SUM, 'mean': tf.losses.Reduction.MEAN}[FLAGS.loss_reduction]
        devices = ['/gpu:%d' % i for i in range(FLAGS.num_gpus)]
        estimator_fn = tf.contrib.estimator.replicate_model_fn(model_fn, loss_reduction=reduction, devices=devices)
    elif FLAGS.multi_gpu == 'towers':
        estimator_fn = towers_model_fn
    elif FLAGS.multi_gpu == 'mirrored':
        estimator_fn = model_fn
        strategy = tf.contrib.distribute.MirroredStrategy(num_gpus=FLAGS.num_gpus)
        train_batch = FLAGS.batch_size // FLAGS.num_gpus
    else:
        raise ValueError('--multi_gpu %s: not mirrored, replicate nor towers' % FLAGS.multi_gpu)
    config = tf.estimator.RunConfig(model_dir=FLAGS.model_dir, train_distribute=strategy,
                                    session_config=tf.ConfigProto(allow_soft_placement=True))
    estimator = tf.estimator.Estimator(estimator_fn, config=config)
    estimator.train(lambda: input_fn(FLAGS.data_dir, True, train_batch), max_steps=FLAGS.train_steps)
    results = estimator.evaluate(lambda: input_fn(FLAGS.data_dir, False, FLAGS.eval_batch_size))
    print('step %d: eval accuracy %.4f, loss %.4f' % (results['global_step'], results['accuracy'], results['loss']))


if __name__ == '__main__':
    tf.app.run()
