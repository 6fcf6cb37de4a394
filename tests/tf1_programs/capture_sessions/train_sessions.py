"""A small TF1 tower program written here, trained through the session kind --session names.

Two towers (model_deploy's way: each tower's loss divided by the tower count, the weight decay on
tower 0 only, the towers' gradients summed; with --average the classic tutorial's: each tower's loss
whole, with its weight decay, the gradients averaged) on a one-shot tf.data iterator over a fixed random set;
softmax regression; gradient descent.  --session: plain (tf.Session), monitored (MonitoredSession),
monitored_training (MonitoredTrainingSession), supervisor (tf.train.Supervisor), slim
(slim.learning.train, which runs a Supervisor).  All but plain finalize the graph before training.
"""
import numpy as np
import tensorflow as tf

slim = tf.contrib.slim

flags = tf.app.flags
flags.DEFINE_string('session', 'plain', 'plain, monitored, monitored_training, supervisor or slim')
flags.DEFINE_string('train_dir', '/tmp/train_sessions', 'where the supervisors write')
flags.DEFINE_integer('num_gpus', 2, 'towers')
flags.DEFINE_integer('batch_size', 8, 'rows per tower')
flags.DEFINE_boolean('average', False, 'the classic way instead: tower losses whole, gradients averaged')
FLAGS = flags.FLAGS


def tower_loss(x, y, tower):
  with tf.variable_scope('model', reuse=tower > 0):
    w = tf.get_variable('weights', [6, 3], initializer=tf.truncated_normal_initializer(stddev=0.1))
    b = tf.get_variable('biases', [3], initializer=tf.zeros_initializer())
  logits = tf.matmul(x, w) + b
  loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
  if FLAGS.average:
    return loss + 1e-3 * tf.nn.l2_loss(w)
  loss = loss / FLAGS.num_gpus
  if tower == 0:
    loss += 1e-3 * tf.nn.l2_loss(w)
  return loss


def main(_):
  rng = np.random.RandomState(0)
  xs = rng.normal(size=(256, 6)).astype(np.float32)
  ys = rng.randint(0, 3, 256).astype(np.int32)
  rows = FLAGS.batch_size * FLAGS.num_gpus
  x, y = tf.data.Dataset.from_tensor_slices((xs, ys)).repeat().batch(rows).make_one_shot_iterator().get_next()
  global_step = tf.train.get_or_create_global_step()
  opt = tf.train.GradientDescentOptimizer(0.1)
  xs_split, ys_split = tf.split(x, FLAGS.num_gpus), tf.split(y, FLAGS.num_gpus)
  grads, losses = [], []
  for i in range(FLAGS.num_gpus):
    with tf.device('/gpu:%d' % i), tf.name_scope('clone_%d' % i):
      loss = tower_loss(xs_split[i], ys_split[i], i)
      losses.append(loss)
      grads.append(opt.compute_gradients(loss))
  if FLAGS.average:
    summed = [(tf.reduce_mean(tf.concat([tf.expand_dims(g, 0) for g, _ in pairs], 0), 0), pairs[0][1])
              for pairs in zip(*grads)]
    total_loss = tf.reduce_mean(losses, name='total_loss')
  else:
    summed = [(tf.add_n([g for g, _ in pairs]), pairs[0][1]) for pairs in zip(*grads)]
    total_loss = tf.add_n(losses, name='total_loss')
  train_op = opt.apply_gradients(summed, global_step=global_step)
  with tf.control_dependencies([train_op]):
    train_tensor = tf.identity(total_loss, name='train_op')
  steps = 3
  if FLAGS.session == 'plain':
    with tf.Session() as sess:
      sess.run(tf.global_variables_initializer())
      for _ in range(steps):
        sess.run(train_tensor)
  elif FLAGS.session == 'monitored':
    with tf.train.MonitoredSession() as sess:
      for _ in range(steps):
        sess.run(train_tensor)
  elif FLAGS.session == 'monitored_training':
    with tf.train.MonitoredTrainingSession(checkpoint_dir=FLAGS.train_dir, save_summaries_steps=None,
                                           save_checkpoint_secs=None) as sess:
      for _ in range(steps):
        sess.run(train_tensor)
  elif FLAGS.session == 'supervisor':
    sv = tf.train.Supervisor(logdir=FLAGS.train_dir, save_model_secs=0, save_summaries_secs=0)
    with sv.managed_session() as sess:
      for _ in range(steps):
        sess.run(train_tensor)
  else:
    slim.learning.train(train_tensor, FLAGS.train_dir, number_of_steps=steps, save_summaries_secs=0,
                        save_interval_secs=0, log_every_n_steps=1)
  print('trained %d steps with %s' % (steps, FLAGS.session))


if __name__ == '__main__':
  tf.app.run()
