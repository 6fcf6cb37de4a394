"""Each tower reads its own rows from a tf.data iterator, gradients averaged as a sum divided by the
tower count, trained in a tf.train.MonitoredSession (which finalizes the graph).

    python -m legacy.run_tf1 monitored_session.py --num_gpus 2 --max_steps 3
"""
import tensorflow as tf

import tiny_towers

FLAGS = tf.app.flags.FLAGS
tf.app.flags.DEFINE_integer('num_gpus', 2, 'How many towers.')
tf.app.flags.DEFINE_integer('batch_size', 4, 'Rows per tower.')
tf.app.flags.DEFINE_integer('max_steps', 3, 'Training steps.')


def main(_):
  with tf.Graph().as_default():
    global_step = tf.train.get_or_create_global_step()
    images, labels = tiny_towers.data(64)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(FLAGS.batch_size)
    iterator = tf.data.make_one_shot_iterator(dataset)
    opt = tf.train.GradientDescentOptimizer(0.1)
    tower_grads = []
    with tf.variable_scope(tf.get_variable_scope()):
      for i in range(FLAGS.num_gpus):
        with tf.device('/gpu:%d' % i), tf.name_scope('tower_%d' % i):
          x, y = iterator.get_next()
          loss = tiny_towers.tower_loss(x, y)
          tf.get_variable_scope().reuse_variables()
          tower_grads.append(opt.compute_gradients(loss))
    averaged = [(tf.add_n([g for g, _ in gv]) / len(gv), gv[0][1]) for gv in zip(*tower_grads)]
    train_op = opt.apply_gradients(averaged, global_step=global_step)
    hooks = [tf.train.StopAtStepHook(last_step=FLAGS.max_steps)]
    creator = tf.train.ChiefSessionCreator(config=tf.ConfigProto(allow_soft_placement=True))
    with tf.train.MonitoredSession(session_creator=creator, hooks=hooks) as sess:
      while not sess.should_stop():
        sess.run(train_op)


if __name__ == '__main__':
  tf.app.run()
