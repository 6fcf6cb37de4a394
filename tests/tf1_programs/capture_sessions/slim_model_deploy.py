"""TF-Slim's train_image_classifier.py in miniature: clones built the way models/research/slim's
deployment/model_deploy.py builds them (each clone's loss divided by the clone count, the
regularisation added to the first clone's loss only, the clones' gradients SUMMED, total_loss the sum
of the clone losses), trained by slim.learning.train (a Supervisor, which finalizes the graph).

    python -m legacy.run_tf1 slim_model_deploy.py --num_clones 2 --train_dir /tmp/slim_model_deploy
"""
import tensorflow as tf

from legacy import slim_compat  # noqa: F401  (before tf_slim: tf-slim on TF 2.21)
import tf_slim as slim

import tiny_towers

FLAGS = tf.app.flags.FLAGS
tf.app.flags.DEFINE_integer('num_clones', 2, 'Number of model clones to deploy.')
tf.app.flags.DEFINE_integer('batch_size', 4, 'Rows per clone.')
tf.app.flags.DEFINE_integer('max_number_of_steps', 2, 'Training steps.')
tf.app.flags.DEFINE_float('weight_decay', 0.01, 'L2 regularisation of the weights.')
tf.app.flags.DEFINE_string('train_dir', '/tmp/slim_model_deploy', 'Checkpoints and event logs.')


def network(images):
  with slim.arg_scope([slim.fully_connected], weights_regularizer=slim.l2_regularizer(FLAGS.weight_decay)):
    net = slim.fully_connected(images, tiny_towers.HIDDEN, scope='fc1')
    return slim.fully_connected(net, tiny_towers.CLASSES, activation_fn=None, scope='logits')


# -- model_deploy, as deployment/model_deploy.py writes it (one worker, no parameter server) --------
def create_clones(num_clones, model_fn, args):
  clones = []
  for i in range(num_clones):
    scope = 'clone_%d' % i
    with tf.name_scope(scope), tf.device('/device:GPU:%d' % i):
      with tf.variable_scope(tf.get_variable_scope(), reuse=True if i > 0 else None):
        outputs = model_fn(*args)
      clones.append((outputs, scope, '/device:GPU:%d' % i))
  return clones


def _gather_clone_loss(clone, num_clones, regularization_losses):
  _, scope, device = clone
  with tf.device(device):
    all_losses = []
    clone_losses = tf.get_collection(tf.GraphKeys.LOSSES, scope)
    if clone_losses:
      clone_loss = tf.add_n(clone_losses, name='clone_loss')
      if num_clones > 1:
        clone_loss = tf.div(clone_loss, 1.0 * num_clones, name='scaled_clone_loss')
      all_losses.append(clone_loss)
    if regularization_losses:
      all_losses.append(tf.add_n(regularization_losses, name='regularization_loss'))
    return tf.add_n(all_losses)


def _sum_clones_gradients(clone_grads):
  sum_grads = []
  for grad_and_vars in zip(*clone_grads):
    var = grad_and_vars[0][1]
    grads = [g for g, _ in grad_and_vars if g is not None]
    sum_grads.append((tf.add_n(grads, name=var.op.name + '/sum_grads') if len(grads) > 1 else grads[0], var))
  return sum_grads


def optimize_clones(clones, optimizer):
  grads_and_vars, clones_losses = [], []
  regularization_losses = tf.get_collection(tf.GraphKeys.REGULARIZATION_LOSSES)
  for clone in clones:
    with tf.name_scope(clone[1]):
      clone_loss = _gather_clone_loss(clone, len(clones), regularization_losses)
      grads_and_vars.append(optimizer.compute_gradients(clone_loss))
      clones_losses.append(clone_loss)
      regularization_losses = None  # Only use regularization_losses for the first clone
  total_loss = tf.add_n(clones_losses, name='total_loss')
  return total_loss, _sum_clones_gradients(grads_and_vars)


def main(_):
  with tf.Graph().as_default():
    with tf.device('/device:CPU:0'):
      global_step = slim.create_global_step()
    images, labels = tiny_towers.data(64)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(FLAGS.batch_size)
    iterator = tf.data.make_one_shot_iterator(dataset)

    def clone_fn():
      x, y = iterator.get_next()
      logits = network(x)
      tf.losses.sparse_softmax_cross_entropy(labels=y, logits=logits)
      return logits

    clones = create_clones(FLAGS.num_clones, clone_fn, ())
    optimizer = tf.train.GradientDescentOptimizer(0.1)
    total_loss, clones_gradients = optimize_clones(clones, optimizer)
    grad_updates = optimizer.apply_gradients(clones_gradients, global_step=global_step)
    update_op = tf.group(grad_updates)
    with tf.control_dependencies([update_op]):
      train_tensor = tf.identity(total_loss, name='train_op')
    slim.learning.train(train_tensor, logdir=FLAGS.train_dir, number_of_steps=FLAGS.max_number_of_steps,
                        save_summaries_secs=3600, save_interval_secs=3600,
                        session_config=tf.ConfigProto(allow_soft_placement=True))


if __name__ == '__main__':
  tf.app.run()
