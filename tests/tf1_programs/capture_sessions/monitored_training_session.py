"""Towers split from one tf.data batch, gradients averaged by tf.reduce_mean over a tf.stack, trained in
tf.train.MonitoredTrainingSession (which finalizes the graph).

    python -m legacy.run_tf1 monitored_training_session.py --num_gpus 2 --train_dir /tmp/mts
"""
import tensorflow as tf

import tiny_towers

FLAGS = tf.app.flags.FLAGS
tf.app.flags.DEFINE_integer('num_gpus', 2, 'How many towers.')
tf.app.flags.DEFINE_integer('batch_size', 8, 'Rows of a step, over all towers.')
tf.app.flags.DEFINE_integer('max_steps', 3, 'Training steps.')
tf.app.flags.DEFINE_string('train_dir', '/tmp/monitored_training_session', 'Checkpoints and summaries.')


def main(_):
  with tf.Graph().as_default():
    global_step = tf.train.get_or_create_global_step()
    images, labels = tiny_towers.data(64)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(FLAGS.batch_size)
    x, y = tf.data.make_one_shot_iterator(dataset).get_next()
    opt = tf.train.MomentumOptimizer(0.1, 0.9)
    tower_grads = []
    with tf.variable_scope(tf.get_variable_scope()):
      for i, (xs, ys) in enumerate(zip(tf.split(x, FLAGS.num_gpus), tf.split(y, FLAGS.num_gpus))):
        with tf.device('/gpu:%d' % i), tf.name_scope('tower_%d' % i):
          loss = tiny_towers.tower_loss(xs, ys)
          tf.get_variable_scope().reuse_variables()
          tower_grads.append(opt.compute_gradients(loss))
    averaged = [(tf.reduce_mean(tf.stack([g for g, _ in gv]), axis=0), gv[0][1]) for gv in zip(*tower_grads)]
    train_op = opt.apply_gradients(averaged, global_step=global_step)
    hooks = [tf.train.StopAtStepHook(last_step=FLAGS.max_steps)]
    with tf.train.MonitoredTrainingSession(checkpoint_dir=FLAGS.train_dir, hooks=hooks, save_checkpoint_secs=None,
                                           save_summaries_steps=None,
                                           config=tf.ConfigProto(allow_soft_placement=True)) as sess:
      while not sess.should_stop():
        sess.run(train_op)


if __name__ == '__main__':
  tf.app.run()
