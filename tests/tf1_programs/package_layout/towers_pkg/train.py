"""A TF1 tower program laid out as a package, run from the folder above it (written here).

    cd tests/tf1_programs/package_layout && python -m legacy.run_tf1 towers_pkg/train.py --num_gpus 2

Its own modules are imported through the package's name (`from towers_pkg import model`), which
Python resolves through the working directory, as TensorFlow's 2018 inception trainer imports its
`inception` folder; the folder has no __init__.py (a namespace package), its `nets` subpackage has.
"""
import numpy as np
import tensorflow as tf

from towers_pkg import model

FLAGS = tf.app.flags.FLAGS
tf.app.flags.DEFINE_integer('num_gpus', 2, 'towers, one per GPU')
tf.app.flags.DEFINE_integer('max_steps', 3, 'training steps')
tf.app.flags.DEFINE_integer('batch_size', 8, 'rows per tower')


def main(_):
  rng = np.random.RandomState(0)
  x = tf.constant(rng.normal(size=(FLAGS.batch_size * FLAGS.num_gpus, model.FEATURES)).astype(np.float32))
  y = tf.one_hot(tf.constant(rng.randint(0, model.CLASSES, FLAGS.batch_size * FLAGS.num_gpus)), model.CLASSES)
  opt = tf.train.GradientDescentOptimizer(0.1)
  tower_grads = []
  for i, (xs, ys) in enumerate(zip(tf.split(x, FLAGS.num_gpus), tf.split(y, FLAGS.num_gpus))):
    with tf.device('/gpu:%d' % i), tf.name_scope('tower_%d' % i):
      loss = model.tower_loss(xs, ys, reuse=i > 0)
      tower_grads.append(opt.compute_gradients(loss))
  grads = [(tf.reduce_mean(tf.stack([g for g, _ in pairs]), 0), pairs[0][1]) for pairs in zip(*tower_grads)]
  train_op = opt.apply_gradients(grads)
  with tf.Session() as sess:
    sess.run(tf.global_variables_initializer())
    for step in range(FLAGS.max_steps):
      _, loss_value = sess.run([train_op, loss])
      assert np.isfinite(loss_value), 'the loss is not finite'
  print('trained %d steps on %d towers, loss %.4f' % (FLAGS.max_steps, FLAGS.num_gpus, loss_value))


if __name__ == '__main__':
  tf.app.run()
