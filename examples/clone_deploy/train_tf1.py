"""Train a small CifarNet on deployed clones (TensorFlow 1, TF-Slim's model_deploy style, 2018).

    python -m legacy.run_tf1 examples/clone_deploy/train_tf1.py --dataset_dir DIR --num_clones 2

Written for TensorFlow 1.x and run as it is on TensorFlow 2.21 by `legacy/run_tf1/`: `tf.contrib.slim`,
`tf.app.flags`, queue runners, clones on `/gpu:%d`, `slim.learning.train`.  The traits of TF-Slim's
`train_image_classifier.py` that a judge must read from the graph rather than assume:
  * `--batch_size` rows per clone, read through `tf.train.batch` (a static batch shape) and a
    prefetch queue that every clone dequeues from;
  * each clone's loss divided by the number of clones, the regularisation added to the first clone's
    loss only, the clones' gradients SUMMED (not averaged), `total_loss` their sum;
  * the network built with `is_training=True` in the training graph: its dropout is on for whatever
    is fed, there is no inference mode in this graph (an evaluator builds its own);
  * RMSProp with TF1's mean square starting at 1, on a staircase exponential decay whose steps count
    one clone's batch (`num_samples * num_epochs_per_decay / batch_size`, the trainer's own formula);
  * `slim.learning.train`, whose Supervisor finalizes the graph before the first step.
Its Keras 3 port is modern_train.py; adapter.py lets the parity harness judge the two.
"""
import os

import tensorflow as tf

slim = tf.contrib.slim

IMAGE_SIZE = 32
NUM_CLASSES = 10

flags = tf.app.flags
flags.DEFINE_string('dataset_dir', '/tmp/clone_deploy_data', 'folder of train-*.tfrecord files')
flags.DEFINE_string('train_dir', '/tmp/clone_deploy_train', 'where checkpoints and summaries are written')
flags.DEFINE_integer('num_clones', 1, 'model clones, one per GPU')
flags.DEFINE_integer('batch_size', 32, 'images per clone per step')
flags.DEFINE_integer('max_number_of_steps', 1000, 'training steps')
flags.DEFINE_integer('num_preprocessing_threads', 4, 'threads that batch the rows')
flags.DEFINE_integer('num_samples', 10000, 'training images per epoch')
flags.DEFINE_float('weight_decay', 0.00004, 'l2 weight decay of the conv and hidden weights')
flags.DEFINE_float('learning_rate', 0.01, 'initial learning rate')
flags.DEFINE_float('learning_rate_decay_factor', 0.94, 'learning rate decay factor')
flags.DEFINE_float('num_epochs_per_decay', 2.0, 'epochs after which the learning rate decays')
flags.DEFINE_float('rmsprop_decay', 0.9, 'decay of the RMSProp mean square')
flags.DEFINE_float('rmsprop_momentum', 0.9, 'RMSProp momentum')
flags.DEFINE_float('opt_epsilon', 1.0, 'epsilon of the optimizer')
flags.DEFINE_float('label_smoothing', 0.0, 'label smoothing of the cross-entropy')
flags.DEFINE_float('dropout_keep_prob', 0.5, 'the fraction of the hidden units dropout keeps')
FLAGS = flags.FLAGS


def inputs():
  """One clone's batch at a time: TFRecords of raw 32x32x3 uint8 images and int64 labels, in file order."""
  files = sorted(tf.gfile.Glob(os.path.join(FLAGS.dataset_dir, 'train-*.tfrecord')))
  if not files:
    raise ValueError('no train-*.tfrecord file in %s' % FLAGS.dataset_dir)
  _, serialized = tf.TFRecordReader().read(tf.train.string_input_producer(files, shuffle=False))
  features = tf.parse_single_example(serialized, features={
      'image': tf.FixedLenFeature([], tf.string),
      'label': tf.FixedLenFeature([], tf.int64),
  })
  image = tf.reshape(tf.decode_raw(features['image'], tf.uint8), [IMAGE_SIZE, IMAGE_SIZE, 3])
  image = tf.cast(image, tf.float32) / 127.5 - 1.0
  label = tf.cast(features['label'], tf.int32)
  return tf.train.batch([image, label], batch_size=FLAGS.batch_size,
                        num_threads=FLAGS.num_preprocessing_threads, capacity=5 * FLAGS.batch_size)


def cifarnet(images, is_training=True):
  """conv 5x5x32 -> pool -> conv 5x5x64 -> pool -> fc 128 -> dropout -> fc 64 -> 10 logits.

  As TF-Slim's cifarnet: the weight decay on the conv and hidden layers, none on the logits."""
  with slim.arg_scope([slim.conv2d, slim.fully_connected], activation_fn=tf.nn.relu,
                      weights_initializer=tf.truncated_normal_initializer(stddev=0.05),
                      weights_regularizer=slim.l2_regularizer(FLAGS.weight_decay)):
    with tf.variable_scope('CifarNet', [images]):
      net = slim.conv2d(images, 32, [5, 5], scope='conv1')
      net = slim.max_pool2d(net, [2, 2], 2, scope='pool1')
      net = slim.conv2d(net, 64, [5, 5], scope='conv2')
      net = slim.max_pool2d(net, [2, 2], 2, scope='pool2')
      net = slim.flatten(net)
      net = slim.fully_connected(net, 128, scope='fc3')
      net = slim.dropout(net, FLAGS.dropout_keep_prob, is_training=is_training, scope='dropout3')
      net = slim.fully_connected(net, 64, scope='fc4')
      return slim.fully_connected(net, NUM_CLASSES, activation_fn=None, weights_regularizer=None,
                                  weights_initializer=tf.truncated_normal_initializer(stddev=1 / 64.0),
                                  scope='logits')


def clone_fn(batch_queue):
  images, labels = batch_queue.dequeue()
  logits = cifarnet(images, is_training=True)
  tf.losses.softmax_cross_entropy(slim.one_hot_encoding(labels, NUM_CLASSES), logits,
                                  label_smoothing=FLAGS.label_smoothing)
  return logits


def sum_clones_gradients(clone_grads):
  """model_deploy's _sum_clones_gradients: the clones' gradients of one variable added up."""
  sum_grads = []
  for grad_and_vars in zip(*clone_grads):
    grads = [g for g, _ in grad_and_vars if g is not None]
    if grads:
      sum_grads.append((tf.add_n(grads, name=grad_and_vars[0][1].op.name + '/sum_grads'), grad_and_vars[0][1]))
  return sum_grads


def main(_):
  tf.logging.set_verbosity(tf.logging.INFO)
  with tf.Graph().as_default():
    with tf.device('/cpu:0'):
      global_step = slim.create_global_step()
      images, labels = inputs()
      batch_queue = slim.prefetch_queue.prefetch_queue([images, labels], capacity=2 * FLAGS.num_clones)
      decay_steps = int(FLAGS.num_samples / FLAGS.batch_size * FLAGS.num_epochs_per_decay)
      learning_rate = tf.train.exponential_decay(FLAGS.learning_rate, global_step, decay_steps,
                                                 FLAGS.learning_rate_decay_factor, staircase=True,
                                                 name='exponential_decay_learning_rate')
      optimizer = tf.train.RMSPropOptimizer(learning_rate, decay=FLAGS.rmsprop_decay,
                                            momentum=FLAGS.rmsprop_momentum, epsilon=FLAGS.opt_epsilon)

    clones_losses, clones_gradients, regularization_loss = [], [], None
    for i in range(FLAGS.num_clones):
      with tf.name_scope('clone_%d' % i) as clone_scope, tf.device('/gpu:%d' % i):
        with tf.variable_scope(tf.get_variable_scope(), reuse=True if i > 0 else None):
          with slim.arg_scope([slim.model_variable, slim.variable], device='/cpu:0'):
            clone_fn(batch_queue)
        clone_loss = tf.add_n(tf.losses.get_losses(scope=clone_scope), name='clone_loss')
        if FLAGS.num_clones > 1:
          clone_loss = tf.div(clone_loss, 1.0 * FLAGS.num_clones, name='scaled_clone_loss')
        sum_loss = clone_loss
        if i == 0:
          regularization_loss = tf.add_n(tf.losses.get_regularization_losses(), name='regularization_loss')
          sum_loss = tf.add_n([clone_loss, regularization_loss])
        clones_losses.append(clone_loss)
        clones_gradients.append(optimizer.compute_gradients(sum_loss))

    with tf.device('/cpu:0'):
      total_loss = tf.add_n(clones_losses + [regularization_loss], name='total_loss')
      grad_updates = optimizer.apply_gradients(sum_clones_gradients(clones_gradients), global_step=global_step)
      with tf.control_dependencies([grad_updates]):
        train_tensor = tf.identity(total_loss, name='train_op')
      tf.summary.scalar('total_loss', total_loss)
      tf.summary.scalar('learning_rate', learning_rate)

    slim.learning.train(train_tensor, logdir=FLAGS.train_dir, number_of_steps=FLAGS.max_number_of_steps,
                        log_every_n_steps=10, save_summaries_secs=600, save_interval_secs=600)


if __name__ == '__main__':
  tf.app.run()
